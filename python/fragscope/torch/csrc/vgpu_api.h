/* The C interface between fragscope's native core (fragscope._core, which links no framework)
 * and the virtual GPU's hook into c10 (this folder, compiled against the torch the user runs:
 * fragscope/torch/csrc.py). Plain C types only, so that the two sides may come from different
 * compilers, standard libraries and C++ ABIs.
 *
 * The core owns the simulation (one session at a time, every counter and trace); the hook owns
 * the c10 allocator wrapper and knows only which allocations it handed to the core. Every
 * function of the table may be called from any thread; the core serializes them. */
#ifndef FRAGSCOPE_TORCH_HOOK_VGPU_API_H_
#define FRAGSCOPE_TORCH_HOOK_VGPU_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever the table or a struct below changes; the hook refuses another version. */
#define FRAGSCOPE_VGPU_API_VERSION 1

/* Why an allocation stays on the CPU in a GPU run (cpu_only.h); 0 = it goes to the device. */
#define FRAGSCOPE_CPU_ONLY_NONE 0
#define FRAGSCOPE_CPU_ONLY_KINDS 6

/* One allocation the core simulated: handed back unchanged at its free. */
typedef struct FragscopeVgpuBlock {
  uint32_t session; /* the session that simulated it; a later session ignores it */
  uint64_t handle;  /* the simulator's block */
  uint64_t id;      /* the request trace's id */
  uint64_t size;    /* requested bytes */
} FragscopeVgpuBlock;

/* on_alloc's answers. */
#define FRAGSCOPE_VGPU_PASS 0      /* not simulated: allocate on the CPU only */
#define FRAGSCOPE_VGPU_SIMULATED 1 /* simulated: *block filled, keep it for on_free */
#define FRAGSCOPE_VGPU_OOM 2       /* raise c10::OutOfMemoryError with the message */

typedef struct FragscopeVgpuApi {
  uint32_t version; /* FRAGSCOPE_VGPU_API_VERSION */
  /* Nonzero when a session runs that leaves CPU-only allocations out (so the hook classifies). */
  int (*wants_classification)(void);
  /* An allocation of nbytes > 0, of the given CPU-only kind. On FRAGSCOPE_VGPU_OOM the message
   * (PyTorch's text) is written to message, NUL-terminated, cut to capacity. */
  int (*on_alloc)(uint64_t nbytes, int cpu_only_kind, FragscopeVgpuBlock* block, char* message,
                  size_t capacity);
  /* The host could not allocate the memory the core simulated: take the block back. */
  void (*undo_alloc)(const FragscopeVgpuBlock* block);
  void (*on_free)(const FragscopeVgpuBlock* block);
  /* A zero-byte allocation (never simulated: CUDA's allocator returns a null pointer). */
  void (*on_zero_size)(void);
} FragscopeVgpuApi;

#ifdef __cplusplus
}
#endif

#endif /* FRAGSCOPE_TORCH_HOOK_VGPU_API_H_ */
