#include "model/bfc_allocator_sim.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include <fmt/format.h>

#include "common/units.h"

namespace fragscope::model {
namespace {

constexpr std::uint64_t kDefaultAddressBase = 0x7f0000000000;
constexpr std::uint64_t kRegionAlignment = 2 * kMiB;
constexpr std::uint64_t kMaxInternalFragmentation = 128 * kMiB;
constexpr std::uint64_t kNoLimit = std::uint64_t{1} << 50;  // 1 PiB

std::uint64_t RoundedBytes(std::uint64_t bytes) {
  return (bytes + kBfcMinAllocation - 1) / kBfcMinAllocation * kBfcMinAllocation;
}

// TensorFlow multiplies a size_t by its `float` back-off factor 0.9: the product is computed in
// single precision and truncated back to an integer before it is rounded up to 256 bytes.
std::uint64_t BackedOff(std::uint64_t bytes) {
  const float shrunk = static_cast<float>(bytes) * 0.9f;
  return RoundedBytes(static_cast<std::uint64_t>(shrunk));
}

}  // namespace

std::string_view BfcVersionName(BfcVersion version) {
  switch (version) {
    case BfcVersion::kTf0:
      return "TensorFlow 0.x";
    case BfcVersion::kTf2:
      return "TensorFlow 1.x-2.x (common_runtime)";
    case BfcVersion::kNewest:
      return "tsl / xla (TensorFlow 2.21, JAX)";
  }
  return "?";
}

int BfcBinForSize(std::uint64_t size) {
  const std::uint64_t v = std::max<std::uint64_t>(size, kBfcMinAllocation) >> 8;
  const int log2 = 63 - std::countl_zero(v);
  return std::min(log2, kBfcNumBins - 1);
}

std::string TfHumanBytes(std::uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{}B", bytes);
  static constexpr char kUnits[] = "KMGTPE";
  double value = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  return unit == 0 ? fmt::format("{:.1f}KiB", value)
                   : fmt::format("{:.2f}{}iB", value, kUnits[unit]);
}

// ---- settings ---------------------------------------------------------------------------

namespace {

Result<bool> ParseBool(std::string_view key, std::string_view value) {
  if (value == "true" || value == "True" || value == "1") return true;
  if (value == "false" || value == "False" || value == "0") return false;
  return Status::InvalidArgument(fmt::format("{}: expected true or false, got \"{}\"", key, value));
}

Result<double> ParseFraction(std::string_view key, std::string_view value, bool zero_ok) {
  const std::string text(value);
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || v > 1.0 ||
      v < 0.0 || (!zero_ok && v == 0.0)) {
    return Status::InvalidArgument(fmt::format("{}: expected a fraction in {}0, 1], got \"{}\"",
                                               key, zero_ok ? "[" : "(", value));
  }
  return v;
}

}  // namespace

Result<BfcSettings> ParseBfcSettings(std::string_view conf) {
  BfcSettings s;
  std::string text;
  for (const char c : conf) {
    if (c != ' ' && c != '\t' && c != '\n') text.push_back(c);
  }
  std::string_view rest = text;
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (item.empty()) continue;
    const std::size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      return Status::InvalidArgument(fmt::format("\"{}\": expected key:value", item));
    }
    const std::string_view key = item.substr(0, colon);
    const std::string_view value = item.substr(colon + 1);
    if (key == "allow_growth" || key == "preallocate") {
      Result<bool> b = ParseBool(key, value);
      if (!b.ok()) return b.status();
      s.allow_growth = key == "allow_growth" ? *b : !*b;
    } else if (key == "garbage_collection") {
      Result<bool> b = ParseBool(key, value);
      if (!b.ok()) return b.status();
      s.garbage_collection = *b;
    } else if (key == "memory_limit") {
      Result<std::uint64_t> bytes = ParseSize(value);
      if (!bytes.ok()) return Status::InvalidArgument("memory_limit: " + bytes.status().message());
      if (*bytes < kBfcMinAllocation) {
        return Status::InvalidArgument(
            fmt::format("memory_limit: {} is less than one 256-byte chunk", value));
      }
      s.memory_limit = *bytes;
    } else if (key == "memory_fraction") {
      Result<double> f = ParseFraction(key, value, false);
      if (!f.ok()) return f.status();
      s.memory_fraction = *f;
    } else if (key == "fragmentation_fraction") {
      Result<double> f = ParseFraction(key, value, true);
      if (!f.ok()) return f.status();
      s.fragmentation_fraction = *f;
    } else if (key == "regions") {
      if (value != "ascending" && value != "descending") {
        return Status::InvalidArgument(
            fmt::format("regions: expected ascending or descending, got \"{}\"", value));
      }
      s.descending_regions = value == "descending";
    } else if (key == "version") {
      if (value == "newest" || value == "tsl" || value == "xla") {
        s.version = BfcVersion::kNewest;
      } else if (value == "2.x" || value == "1.x") {
        s.version = BfcVersion::kTf2;
      } else if (value == "0.x") {
        s.version = BfcVersion::kTf0;
      } else {
        return Status::InvalidArgument(
            fmt::format("version: expected newest, 2.x or 0.x, got \"{}\"", value));
      }
    } else {
      return Status::InvalidArgument(fmt::format(
          "unknown key \"{}\" (known: allow_growth, preallocate, memory_limit, memory_fraction, "
          "garbage_collection, fragmentation_fraction, regions, version)",
          key));
    }
  }
  if (s.fragmentation_fraction > 0 && s.version != BfcVersion::kNewest) {
    return Status::InvalidArgument(
        "fragmentation_fraction: only the newest allocator (tsl / xla) has it");
  }
  if (s.garbage_collection && s.version == BfcVersion::kTf0) {
    return Status::InvalidArgument("garbage_collection: TensorFlow 0.x's allocator has none");
  }
  return s;
}

std::string ToBfcConfString(const BfcSettings& s) {
  const BfcSettings d;
  std::vector<std::string> parts;
  if (s.allow_growth != d.allow_growth) {
    parts.push_back(fmt::format("allow_growth:{}", s.allow_growth));
  }
  if (s.memory_limit) parts.push_back(fmt::format("memory_limit:{}", *s.memory_limit));
  if (s.memory_fraction != d.memory_fraction) {
    parts.push_back(fmt::format("memory_fraction:{}", s.memory_fraction));
  }
  if (s.garbage_collection != d.garbage_collection) {
    parts.push_back(fmt::format("garbage_collection:{}", s.garbage_collection));
  }
  if (s.fragmentation_fraction != d.fragmentation_fraction) {
    parts.push_back(fmt::format("fragmentation_fraction:{}", s.fragmentation_fraction));
  }
  if (s.descending_regions) parts.push_back("regions:descending");
  if (s.version == BfcVersion::kTf2) parts.push_back("version:2.x");
  if (s.version == BfcVersion::kTf0) parts.push_back("version:0.x");
  return fmt::format("{}", fmt::join(parts, ","));
}

std::map<std::string, std::int64_t> BfcStats::Flatten(std::uint64_t largest_free_block) const {
  return {
      {"bytes_in_use", bytes_in_use},
      {"bytes_limit", bytes_limit},
      {"largest_alloc_size", largest_alloc_size},
      {"largest_free_block_bytes", static_cast<std::int64_t>(largest_free_block)},
      {"num_allocs", num_allocs},
      {"num_ooms", num_ooms},
      {"num_regions_freed", num_regions_freed},
      {"peak_bytes_in_use", peak_bytes_in_use},
      {"peak_pool_bytes", peak_pool_bytes},
      {"pool_bytes", pool_bytes},
  };
}

// ---- the allocator ----------------------------------------------------------------------

BfcAllocatorSim::BfcAllocatorSim(const BfcSettings& settings, const BfcDevice& device,
                                 std::int32_t device_index)
    : settings_(settings), device_(device), device_index_(device_index) {
  device_.descending = device.descending || settings.descending_regions;
  if (settings.memory_limit) {
    limit_ = *settings.memory_limit;
  } else if (device.capacity_bytes > 0) {
    const std::uint64_t free =
        device.capacity_bytes - std::min(device.capacity_bytes, device.used_by_others_bytes);
    limit_ = static_cast<std::uint64_t>(static_cast<double>(free) * settings.memory_fraction);
  } else {
    limit_ = kNoLimit;
  }
  const std::uint64_t first_growth = settings.version == BfcVersion::kNewest ? 2 * kMiB : kMiB;
  curr_region_bytes_ =
      RoundedBytes(settings.allow_growth ? std::min(limit_, first_growth) : limit_);
  stats_.bytes_limit = static_cast<std::int64_t>(limit_);
}

std::uint64_t BfcAllocatorSim::largest_free_chunk() const {
  return free_.empty() ? 0 : free_.rbegin()->first;
}

std::uint64_t BfcAllocatorSim::PlaceRegion(std::uint64_t bytes) const {
  const std::uint64_t base = device_.address_base != 0 ? device_.address_base : kDefaultAddressBase;
  if (device_.descending) {
    const auto below = [&](std::uint64_t end) {
      return (end - bytes) / kRegionAlignment * kRegionAlignment;
    };
    std::uint64_t candidate = below(base);
    for (auto r = regions_.rbegin(); r != regions_.rend(); ++r) {
      if (r->first + r->second <= candidate) break;
      candidate = std::min(candidate, below(r->first));
    }
    return candidate;
  }
  std::uint64_t candidate = base;
  for (const auto& [addr, size] : regions_) {
    if (candidate + bytes <= addr) break;
    const std::uint64_t end = addr + size;
    candidate =
        std::max(candidate, (end + kRegionAlignment - 1) / kRegionAlignment * kRegionAlignment);
  }
  return candidate;
}

// The sub-allocator: a device allocation of `bytes` succeeds iff the device has them free.
bool BfcAllocatorSim::Extend(std::uint64_t rounded) {
  const std::uint64_t pool = static_cast<std::uint64_t>(stats_.pool_bytes);
  const std::uint64_t available = (limit_ - pool) / kBfcMinAllocation * kBfcMinAllocation;
  if (rounded > available) return false;
  bool increased = false;
  while (rounded > curr_region_bytes_) {
    curr_region_bytes_ *= 2;
    increased = true;
  }
  std::uint64_t bytes = std::min(curr_region_bytes_, available);
  const auto device_has = [&](std::uint64_t n) {
    if (device_.capacity_bytes == 0) return true;
    const std::uint64_t taken = device_.used_by_others_bytes + pool;
    return taken <= device_.capacity_bytes && n <= device_.capacity_bytes - taken;
  };
  bool ok = device_has(bytes);
  if (!ok && !started_backpedal_) {
    started_backpedal_ = true;  // TensorFlow backs off once in the allocator's life
    // Below 2560 bytes, 0.9x rounded up to 256 bytes no longer shrinks: TensorFlow would try
    // the same size forever there; the model gives up (a device that cannot give 2 KiB).
    if (settings_.version == BfcVersion::kTf0) {
      // 0.x shrinks first and tries only sizes strictly above the request.
      bytes = BackedOff(bytes);
      while (!ok && bytes > rounded) {
        ok = device_has(bytes);
        if (ok || BackedOff(bytes) == bytes) break;
        bytes = BackedOff(bytes);
      }
    } else {
      while (!ok) {
        const std::uint64_t smaller = BackedOff(bytes);
        if (smaller < rounded || smaller == bytes) break;
        bytes = smaller;
        ok = device_has(bytes);
      }
    }
  }
  if (!ok) return false;
  if (!increased) curr_region_bytes_ *= 2;

  const std::uint64_t addr = PlaceRegion(bytes);
  regions_.emplace(addr, bytes);
  chunks_.emplace(addr, Chunk{bytes, 0, addr, false});
  InsertFree(addr, bytes);
  stats_.pool_bytes += static_cast<std::int64_t>(bytes);
  stats_.peak_pool_bytes = std::max(stats_.peak_pool_bytes, stats_.pool_bytes);
  Event e;
  e.action = Action::kSegmentAlloc;
  e.device = device_index_;
  e.addr = addr;
  e.size = bytes;
  e.pool = Pool::kLarge;
  Emit(e);
  return true;
}

bool BfcAllocatorSim::DeallocateFreeRegions(std::uint64_t rounded) {
  if (!settings_.garbage_collection) return false;
  std::vector<std::uint64_t> idle;
  std::uint64_t idle_bytes = 0;
  for (const auto& [addr, size] : regions_) {
    const auto c = chunks_.find(addr);
    // A region with no chunk in use is one free chunk: frees coalesce.
    if (c != chunks_.end() && !c->second.in_use && c->second.size == size) {
      idle.push_back(addr);
      idle_bytes += size;
    }
  }
  if (idle_bytes == 0) return false;
  const std::uint64_t available =
      limit_ - static_cast<std::uint64_t>(stats_.pool_bytes) + idle_bytes;
  if (rounded > available) return false;
  for (const std::uint64_t addr : idle) {
    const std::uint64_t size = regions_[addr];
    EraseFree(addr, size);
    chunks_.erase(addr);
    regions_.erase(addr);
    stats_.pool_bytes -= static_cast<std::int64_t>(size);
    ++stats_.num_regions_freed;
    Event e;
    e.action = Action::kSegmentFree;
    e.device = device_index_;
    e.addr = addr;
    e.size = size;
    Emit(e);
  }
  return true;
}

std::optional<std::uint64_t> BfcAllocatorSim::FindChunk(std::uint64_t rounded,
                                                        std::uint64_t request) {
  // Bins are ranges of sizes searched upwards from the request's bin, each ordered by
  // (size, address): the first fit is the smallest free chunk >= rounded, lowest address first.
  const auto it = free_.lower_bound({rounded, 0});
  if (it == free_.end()) return std::nullopt;
  const std::uint64_t addr = it->second;
  free_.erase(it);
  Chunk& c = chunks_[addr];
  bool split = c.size >= 2 * rounded;
  if (settings_.version != BfcVersion::kTf0) {
    const std::int64_t threshold =
        settings_.fragmentation_fraction > 0.0
            ? static_cast<std::int64_t>(settings_.fragmentation_fraction *
                                        static_cast<double>(limit_))
            : static_cast<std::int64_t>(kMaxInternalFragmentation);
    split = split || static_cast<std::int64_t>(c.size - rounded) >= threshold;
  }
  if (split) {
    const std::uint64_t rest = c.size - rounded;
    c.size = rounded;
    chunks_.emplace(addr + rounded, Chunk{rest, 0, c.region, false});
    InsertFree(addr + rounded, rest);
  }
  Chunk& used = chunks_[addr];
  used.in_use = true;
  used.requested = request;
  ++stats_.num_allocs;
  stats_.bytes_in_use += static_cast<std::int64_t>(used.size);
  stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
  stats_.largest_alloc_size =
      std::max(stats_.largest_alloc_size, static_cast<std::int64_t>(used.size));
  Event e;
  e.action = Action::kAlloc;
  e.device = device_index_;
  e.addr = addr;
  e.size = request;
  e.block_size = used.size;
  Emit(e);
  return addr;
}

Result<std::uint64_t> BfcAllocatorSim::Malloc(std::uint64_t request) {
  const std::uint64_t rounded = RoundedBytes(request);
  if (auto p = FindChunk(rounded, request)) return *p;
  if (Extend(rounded)) {
    if (auto p = FindChunk(rounded, request)) return *p;
  }
  if (DeallocateFreeRegions(rounded) && Extend(rounded)) {
    if (auto p = FindChunk(rounded, request)) return *p;
  }
  BfcOom oom;
  oom.requested = request;
  oom.rounded = rounded;
  oom.in_use = static_cast<std::uint64_t>(stats_.bytes_in_use);
  oom.pool_bytes = static_cast<std::uint64_t>(stats_.pool_bytes);
  oom.limit = limit_;
  oom.largest_free_chunk = largest_free_chunk();
  oom.message =
      fmt::format("Allocator (bfc) ran out of memory trying to allocate {} (rounded to {})",
                  TfHumanBytes(request), rounded);
  ++stats_.num_ooms;
  Event e;
  e.action = Action::kOom;
  e.device = device_index_;
  e.size = rounded;
  e.device_free = limit_ - oom.pool_bytes;
  Emit(e);
  last_oom_ = oom;
  return Status::OutOfMemory(oom.message);
}

Status BfcAllocatorSim::Free(std::uint64_t addr) {
  auto it = chunks_.find(addr);
  if (it == chunks_.end() || !it->second.in_use) {
    return Status::InvalidArgument(fmt::format("free of {:#x}: no chunk in use there", addr));
  }
  Event e;
  e.device = device_index_;
  e.addr = addr;
  e.size = it->second.requested;
  e.action = Action::kFreeRequested;
  Emit(e);
  e.action = Action::kFreeCompleted;
  Emit(e);
  Chunk& c = it->second;
  c.in_use = false;
  c.requested = 0;
  stats_.bytes_in_use -= static_cast<std::int64_t>(c.size);
  // Coalesce with the next chunk, then merge into the previous one, within the region.
  std::uint64_t start = addr;
  const auto next = std::next(it);
  if (next != chunks_.end() && next->second.region == c.region && !next->second.in_use) {
    EraseFree(next->first, next->second.size);
    c.size += next->second.size;
    chunks_.erase(next);
  }
  if (it != chunks_.begin()) {
    const auto prev = std::prev(it);
    if (prev->second.region == c.region && !prev->second.in_use) {
      EraseFree(prev->first, prev->second.size);
      prev->second.size += c.size;
      start = prev->first;
      chunks_.erase(it);
    }
  }
  InsertFree(start, chunks_[start].size);
  return Status::Ok();
}

std::vector<BfcRegion> BfcAllocatorSim::Regions() const {
  std::vector<BfcRegion> out;
  for (const auto& [addr, size] : regions_) {
    BfcRegion r{addr, size, {}};
    for (auto c = chunks_.lower_bound(addr); c != chunks_.end() && c->first < addr + size; ++c) {
      r.chunks.push_back(BfcChunk{c->first, c->second.size, c->second.requested, c->second.in_use});
    }
    out.push_back(std::move(r));
  }
  return out;
}

Status BfcAllocatorSim::CheckInvariants() const {
  std::uint64_t in_use = 0, pool = 0, free_chunks = 0;
  for (const BfcRegion& r : Regions()) {
    pool += r.size;
    std::uint64_t at = r.address;
    bool prev_free = false;
    for (const BfcChunk& c : r.chunks) {
      if (c.address != at || c.size == 0 || c.size % kBfcMinAllocation != 0) {
        return Status::Internal(
            fmt::format("region {:#x}: chunk at {:#x} breaks the tiling", r.address, c.address));
      }
      if (!c.in_use && prev_free) {
        return Status::Internal(fmt::format("two free neighbours at {:#x}", c.address));
      }
      if (c.in_use) {
        in_use += c.size;
      } else {
        ++free_chunks;
        if (free_.count({c.size, c.address}) != 1) {
          return Status::Internal(fmt::format("free chunk {:#x} not in the free set", c.address));
        }
      }
      prev_free = !c.in_use;
      at += c.size;
    }
    if (at != r.address + r.size) {
      return Status::Internal(fmt::format("region {:#x}: chunks do not reach its end", r.address));
    }
  }
  if (free_chunks != free_.size()) return Status::Internal("free set holds stale chunks");
  if (in_use != static_cast<std::uint64_t>(stats_.bytes_in_use)) {
    return Status::Internal("bytes_in_use differs from the chunks in use");
  }
  if (pool != static_cast<std::uint64_t>(stats_.pool_bytes) || pool > limit_) {
    return Status::Internal("pool bytes differ from the regions, or exceed the limit");
  }
  return Status::Ok();
}

}  // namespace fragscope::model
