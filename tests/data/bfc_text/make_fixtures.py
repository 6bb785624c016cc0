#!/usr/bin/env python3
"""Writes the BFC allocator log fixtures of this folder (fragscope's own, following the formats
TensorFlow and XLA print; docs/formats.md, "BFC allocator logs"). Run it from this folder; the
fixtures are committed, this script says how they were made."""


def human(n):
    # TensorFlow's HumanReadableNumBytes: bytes below 1 KiB, else two decimals of the unit.
    if n < 1024:
        return f"{n}B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024.0
        if n < 1024 or unit == "TiB":
            return f"{n:.2f}{unit}"


def bins_lines(chunks, prefix, old=False):
    out = []
    for b in range(21):
        lo = 256 << b
        hi = (256 << (b + 1)) if b < 20 else 1 << 62
        inb = [c for c in chunks if lo <= c[1] < hi or (b == 0 and c[1] < 256)]
        use = [c for c in inb if c[2]]
        tb, ub = sum(c[1] for c in inb), sum(c[1] for c in use)
        if old:
            out.append(f"{prefix}Bin ({lo}): \tTotal Chunks: {len(inb)}, Chunks in use: {len(use)} "
                       f"{human(tb)} allocated for chunks. {human(ub)} client-requested for chunks. "
                       f"{human(ub)} in use in bin. {human(ub)} client-requested in use in bin.")
        else:
            out.append(f"{prefix}Bin ({lo}): \tTotal Chunks: {len(inb)}, Chunks in use: {len(use)}. "
                       f"{human(tb)} allocated for chunks. {human(ub)} in use in bin. "
                       f"{human(ub)} client-requested in use in bin.")
    return out


def layout(base, sizes_in_use):
    """[(addr, size, in_use)] laid out from base."""
    out, a = [], base
    for size, used in sizes_in_use:
        out.append((a, size, used))
        a += size
    return out


MiB = 1 << 20

# --- 1. TensorFlow 1.x (core/common_runtime, before 1.3): dump first, "Ran out of memory" last;
# 0x addresses, "Chunk at" for chunks in use, plain byte counts. Fragmentation: 96 MiB free in
# 1-2 MiB pieces, a 4 MiB request.
p1 = "I tensorflow/core/common_runtime/bfc_allocator.cc:{}] "
region = [(2 * MiB, True), (1 * MiB + 512 * 1024, False)] * 64  # 64 free chunks of 1.5 MiB
chunks = layout(0x10205000000, region)
total = sum(c[1] for c in chunks)
lines = ["I tensorflow/stream_executor/cuda/cuda_gpu_executor.cc:1097] name: GeForce GTX 1080 Ti",
         "major: 6 minor: 1 memoryClockRate (GHz) 1.582",
         "totalMemory: 10.92GiB freeMemory: 10.76GiB"]
lines += bins_lines(chunks, p1.format(643), old=True)
lines.append(p1.format(660) + "Bin for 4.00MiB was 4.00MiB, Chunk State: ")
lines.append(p1.format(678) + f"Next region of size {total}")
for i, (a, s, u) in enumerate(chunks):
    word = "Chunk" if u else "Free"
    lines.append(p1.format(687) + f"{word} at 0x{a:x} of size {s}")
lines.append(p1.format(693) + "     Summary of in-use Chunks by size: ")
inuse = [c for c in chunks if c[2]]
lines.append(p1.format(696) + f"{len(inuse)} Chunks of size {2 * MiB} totalling {human(2 * MiB * len(inuse))}")
lines.append(p1.format(700) + f"Sum Total of in-use chunks: {human(sum(c[1] for c in inuse))}")
lines.append(p1.format(702) + "Stats: ")
lines += [f"Limit:                   {total}", f"InUse:                   {sum(c[1] for c in inuse)}",
          f"MaxInUse:                {sum(c[1] for c in inuse)}", "NumAllocs:                     812",
          f"MaxAllocSize:            {2 * MiB}", ""]
lines.append("W tensorflow/core/common_runtime/bfc_allocator.cc:274] " + "*_" * 50)
lines.append("W tensorflow/core/common_runtime/bfc_allocator.cc:275] Ran out of memory trying to allocate 4.00MiB.  See logs for memory state.")
lines.append("W tensorflow/core/framework/op_kernel.cc:993] Resource exhausted: OOM when allocating tensor with shape[1024,1024]")
open("tf1_fragmentation.log", "w").write("\n".join(lines) + "\n")

# --- 2. TensorFlow 2.x (tsl/framework, 2.9-2.15): timestamps, integer figures, interleaved with
# other loggers. Shortage: the pool is at its limit and holds only 12 MiB free.
p2 = "2024-01-01 12:00:00.{:06d}: I external/local_tsl/tsl/framework/bfc_allocator.cc:{}] "
chunks = layout(0x7F0000000000, [(512 * MiB, True), (4 * MiB, False), (496 * MiB, True),
                                 (8 * MiB, False), (3072 * MiB, True)])
total = sum(c[1] for c in chunks)
used = sum(c[1] for c in chunks if c[2])
lines = ["Epoch 3/10",
         "2024-01-01 12:00:00.000001: W external/local_tsl/tsl/framework/bfc_allocator.cc:485] "
         "Allocator (GPU_0_bfc) ran out of memory trying to allocate 1.00GiB (rounded to 1073741824)requested by op MatMul",
         "If the cause is memory fragmentation maybe the environment variable 'TF_GPU_ALLOCATOR=cuda_malloc_async' will improve the situation. ",
         "Current allocation summary follows.",
         "Current allocation summary follows."]
lines.append(p2.format(2, 1039) + "BFCAllocator dump for GPU_0_bfc")
lines += bins_lines(chunks, p2.format(3, 1046))
lines.append("  12/500 [>.............................] - ETA: 1:02 - loss: 2.3012")  # another writer
lines.append(p2.format(4, 1062) + "Bin for 1.00GiB was 256.00MiB, Chunk State: ")
lines.append(p2.format(5, 1075) + f"Next region of size {total}")
for i, (a, s, u) in enumerate(chunks):
    nxt = i + 1 if i + 1 < len(chunks) else 18446744073709551615
    lines.append(p2.format(6 + i, 1095) + f"{'InUse' if u else 'Free '} at {a:x} of size {s} next {nxt}")
lines.append("[rank0]: some other logger line")
lines.append(p2.format(20, 1100) + "     Summary of in-use Chunks by size: ")
lines.append(p2.format(21, 1107) + f"Sum Total of in-use chunks: {human(used)}")
lines.append(p2.format(22, 1109) + f"total_region_allocated_bytes_: {total} memory_limit_: {total} available bytes: 0 curr_region_allocation_bytes_: {2 * total}")
lines.append(p2.format(23, 1115) + "Stats: ")
lines += [f"Limit:                      {total}", f"InUse:                      {used}",
          f"MaxInUse:                   {used}", "NumAllocs:                        5650",
          f"MaxAllocSize:                {3072 * MiB}", "Reserved:                            0",
          "PeakReserved:                        0", "LargestFreeBlock:                    0", ""]
lines.append("2024-01-01 12:00:00.000030: W external/local_tsl/tsl/framework/bfc_allocator.cc:497] " + "*" * 90 + "_" * 10)
lines.append("2024-01-01 12:00:00.000031: W tensorflow/core/framework/op_kernel.cc:1839] OP_REQUIRES failed at matmul_op_impl.h:731 : RESOURCE_EXHAUSTED: OOM when allocating tensor with shape[16384,16384] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc")
open("tf2_shortage.log", "w").write("\n".join(lines) + "\n")

# --- 3. XLA (xla/tsl/framework, JAX): chunk tags, the allocator memory summary, then XLA's
# RESOURCE_EXHAUSTED. Fragmentation, preallocated pool (growth disabled), a 75% share.
p3 = "E0101 12:00:00.{:06d}  4242 bfc_allocator.cc:{}] "
sizes = []
for i in range(40):
    sizes += [(96 * MiB, True), (32 * MiB, False)]
chunks = layout(0x7A0000000000, sizes)
total = sum(c[1] for c in chunks)
used = sum(c[1] for c in chunks if c[2])
req = 200 * MiB + 1000
lines = ["2025-05-01 10:00:00.000000: W external/xla/xla/tsl/framework/bfc_allocator.cc:501] "
         f"Allocator (GPU_0_bfc) ran out of memory trying to allocate {human(req)} (rounded to {(req + 255) // 256 * 256}) from the lower end requested by op ",
         "If the cause is memory fragmentation maybe the environment variable 'TF_GPU_ALLOCATOR=cuda_malloc_async' will improve the situation. ",
         "Current allocation summary follows."]
lines.append(p3.format(1, 1049) + "BFCAllocator dump for GPU_0_bfc")
lines += bins_lines(chunks, p3.format(2, 1056))
lines.append(p3.format(3, 1085) + f"Next region of size {total}")
for i, (a, s, u) in enumerate(chunks):
    nxt = i + 1 if i + 1 < len(chunks) else 18446744073709551615
    lines.append(p3.format(4, 1090) + f"{'InUse' if u else 'Free '} at {a:x} of size {s} tag lower next {nxt}")
lines.append(p3.format(5, 1117) + f"Sum Total of in-use chunks: {human(used)}")
lines.append(p3.format(6, 1125) + f"Allocator memory summary: rounded request {human((req + 255) // 256 * 256)}, total free in pool {human(total - used)}, largest free chunk usable by lower end {human(32 * MiB)}, unallocated bytes 0B, pool size {human(total)}, pool limit {human(total)}")
lines.append(p3.format(7, 1140) + f"Allocator region growth hint: next region allocation target {human(total)} (growth disabled; fixed-size pool; not an attempted allocation).")
lines.append(p3.format(8, 1147) + "Stats: ")
lines += [f"Limit:                  {human(total)}", f"InUse:                  {human(used)}",
          "NumAllocs:                   91", f"LargestFreeBlock:       {human(32 * MiB)}", ""]
lines.append(p3.format(9, 513) + "*" * 75 + "_" * 25)
lines.append("Traceback (most recent call last):")
lines.append('  File "train.py", line 12, in <module>')
lines.append(f"jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate {req} bytes.")
open("xla_jax_fragmentation.log", "w").write("\n".join(lines) + "\n")

# --- 4. cuda_malloc_async: shortage on the device, the pool's attributes.
lines = ["E0101 12:00:01.000001 777 gpu_cudamallocasync_allocator.cc:361] gpu_async_0 cuMemAllocAsync failed to allocate 8589934592 bytes: RESOURCE_EXHAUSTED: : CUDA_ERROR_OUT_OF_MEMORY: out of memory",
         " Reported by CUDA: Free memory/Total memory: 2147483648/25769803776",
         "E0101 12:00:01.000002 777 gpu_cudamallocasync_allocator.cc:366] Stats: Limit:                     0",
         "InUse:                     20401094656",
         "MaxInUse:                  20937965568",
         "NumAllocs:                       1234",
         "MaxAllocSize:               4294967296",
         "",
         "E0101 12:00:01.000003 777 gpu_cudamallocasync_allocator.cc:70] Histogram of current allocation: (allocation_size_in_bytes, nb_allocation_of_that_sizes), ...;",
         "E0101 12:00:01.000004 777 gpu_cudamallocasync_allocator.cc:73] 4294967296, 4",
         "E0101 12:00:01.000005 777 gpu_cudamallocasync_allocator.cc:73] 3221225472, 1",
         "E0101 12:00:01.000006 777 gpu_cudamallocasync_allocator.cc:102] CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: 21474836480",
         "E0101 12:00:01.000007 777 gpu_cudamallocasync_allocator.cc:103] CU_MEMPOOL_ATTR_USED_MEM_CURRENT: 20401094656",
         "E0101 12:00:01.000008 777 gpu_cudamallocasync_allocator.cc:104] CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: 21474836480",
         "E0101 12:00:01.000009 777 gpu_cudamallocasync_allocator.cc:105] CU_MEMPOOL_ATTR_USED_MEM_HIGH: 20937965568"]
open("cuda_malloc_async.log", "w").write("\n".join(lines) + "\n")
