#include "testing/bfc_reference.h"

#include <algorithm>

namespace fragscope::testing {
namespace {

std::uint64_t Round256(std::uint64_t n) { return (n + 255) / 256 * 256; }

// The bin of a size, by counting doublings from 256 (no bit tricks, on purpose).
int Bin(std::uint64_t size) {
  int bin = 0;
  std::uint64_t top = 512;  // bin 0 holds [256, 512)
  while (bin < model::kBfcNumBins - 1 && size >= top) {
    ++bin;
    top *= 2;
  }
  return bin;
}

}  // namespace

BfcReference::BfcReference(const model::BfcSettings& settings, const model::BfcDevice& device)
    : settings_(settings), device_(device) {
  if (settings.memory_limit) {
    limit_ = *settings.memory_limit;
  } else if (device.capacity_bytes > 0) {
    const std::uint64_t free = device.capacity_bytes > device.used_by_others_bytes
                                   ? device.capacity_bytes - device.used_by_others_bytes
                                   : 0;
    limit_ = static_cast<std::uint64_t>(static_cast<double>(free) * settings.memory_fraction);
  } else {
    limit_ = std::uint64_t{1} << 50;
  }
  const std::uint64_t first =
      settings.version == model::BfcVersion::kNewest ? (2u << 20) : (1u << 20);
  next_region_ = Round256(settings.allow_growth ? std::min(limit_, first) : limit_);
}

std::uint64_t BfcReference::Pool() const {
  std::uint64_t total = 0;
  for (const auto& r : regions_) total += r.size;
  return total;
}

bool BfcReference::Extend(std::uint64_t rounded) {
  const std::uint64_t available = (limit_ - Pool()) / 256 * 256;
  if (rounded > available) return false;
  bool grew = false;
  while (next_region_ < rounded) {
    next_region_ *= 2;
    grew = true;
  }
  std::uint64_t bytes = std::min(next_region_, available);
  auto fits = [&](std::uint64_t n) {
    return device_.capacity_bytes == 0 ||
           device_.used_by_others_bytes + Pool() + n <= device_.capacity_bytes;
  };
  auto shrink = [](std::uint64_t n) {
    return Round256(static_cast<std::uint64_t>(static_cast<float>(n) * 0.9f));
  };
  bool ok = fits(bytes);
  if (!ok && !backed_off_) {
    backed_off_ = true;
    // A size that 0.9x no longer shrinks ends the back-off (TensorFlow would spin there).
    if (settings_.version == model::BfcVersion::kTf0) {
      for (bytes = shrink(bytes); bytes > rounded; bytes = shrink(bytes)) {
        if ((ok = fits(bytes)) || shrink(bytes) == bytes) break;
      }
    } else {
      for (;;) {
        if (shrink(bytes) < rounded || shrink(bytes) == bytes) break;
        bytes = shrink(bytes);
        if ((ok = fits(bytes))) break;
      }
    }
  }
  if (!ok) return false;
  if (!grew) next_region_ *= 2;
  // Lowest 2 MiB-aligned address from the base where the region fits between the others.
  // Descending: the highest such address below the base, stepping below each overlap.
  const std::uint64_t base = device_.address_base ? device_.address_base : 0x7f0000000000;
  const bool down = device_.descending || settings_.descending_regions;
  std::uint64_t at = down ? (base - bytes) / (2u << 20) * (2u << 20) : base;
  for (bool moved = true; moved;) {
    moved = false;
    for (const auto& r : regions_) {
      if (at < r.address + r.size && r.address < at + bytes) {
        at = down ? (r.address - bytes) / (2u << 20) * (2u << 20)
                  : (r.address + r.size + (2u << 20) - 1) / (2u << 20) * (2u << 20);
        moved = true;
      }
    }
  }
  model::BfcRegion region{at, bytes, {model::BfcChunk{at, bytes, 0, false}}};
  regions_.push_back(region);
  std::sort(regions_.begin(), regions_.end(),
            [](const auto& a, const auto& b) { return a.address < b.address; });
  return true;
}

bool BfcReference::CollectGarbage(std::uint64_t rounded) {
  if (!settings_.garbage_collection) return false;
  std::uint64_t idle = 0;
  for (const auto& r : regions_) {
    bool used = false;
    for (const auto& c : r.chunks) used = used || c.in_use;
    if (!used) idle += r.size;
  }
  if (idle == 0 || rounded > limit_ - Pool() + idle) return false;
  std::vector<model::BfcRegion> kept;
  for (const auto& r : regions_) {
    bool used = false;
    for (const auto& c : r.chunks) used = used || c.in_use;
    if (used) kept.push_back(r);
  }
  regions_ = kept;
  return true;
}

std::uint64_t BfcReference::Find(std::uint64_t rounded, std::uint64_t request) {
  // The bins, built afresh: each a list of free chunks sorted by (size, address).
  struct Ref {
    std::size_t region, chunk;
  };
  std::vector<std::vector<Ref>> bins(model::kBfcNumBins);
  for (std::size_t r = 0; r < regions_.size(); ++r) {
    for (std::size_t c = 0; c < regions_[r].chunks.size(); ++c) {
      if (!regions_[r].chunks[c].in_use) bins[Bin(regions_[r].chunks[c].size)].push_back({r, c});
    }
  }
  for (int b = Bin(rounded); b < model::kBfcNumBins; ++b) {
    auto& bin = bins[b];
    std::sort(bin.begin(), bin.end(), [&](const Ref& x, const Ref& y) {
      const auto& cx = regions_[x.region].chunks[x.chunk];
      const auto& cy = regions_[y.region].chunks[y.chunk];
      return cx.size != cy.size ? cx.size < cy.size : cx.address < cy.address;
    });
    for (const Ref& ref : bin) {
      auto& chunks = regions_[ref.region].chunks;
      model::BfcChunk c = chunks[ref.chunk];
      if (c.size < rounded) continue;
      std::uint64_t threshold = std::uint64_t{128} << 20;
      if (settings_.fragmentation_fraction > 0) {
        threshold = static_cast<std::uint64_t>(settings_.fragmentation_fraction *
                                               static_cast<double>(limit_));
      }
      const bool remainder_rule = settings_.version != model::BfcVersion::kTf0;
      if (c.size >= 2 * rounded || (remainder_rule && c.size - rounded >= threshold)) {
        model::BfcChunk rest{c.address + rounded, c.size - rounded, 0, false};
        chunks.insert(chunks.begin() + static_cast<std::ptrdiff_t>(ref.chunk) + 1, rest);
        chunks[ref.chunk].size = rounded;
      }
      chunks[ref.chunk].in_use = true;
      chunks[ref.chunk].requested_size = request;
      return c.address;
    }
  }
  return 0;
}

std::uint64_t BfcReference::Malloc(std::uint64_t request) {
  const std::uint64_t rounded = Round256(request);
  if (std::uint64_t p = Find(rounded, request)) return p;
  if (Extend(rounded)) {
    if (std::uint64_t p = Find(rounded, request)) return p;
  }
  if (CollectGarbage(rounded) && Extend(rounded)) return Find(rounded, request);
  return 0;
}

void BfcReference::Free(std::uint64_t addr) {
  for (auto& r : regions_) {
    for (auto& c : r.chunks) {
      if (c.address == addr) {
        c.in_use = false;
        c.requested_size = 0;
      }
    }
    // Coalesce: rebuild the list, folding each free chunk into a free predecessor.
    std::vector<model::BfcChunk> merged;
    for (const auto& c : r.chunks) {
      if (!merged.empty() && !merged.back().in_use && !c.in_use) {
        merged.back().size += c.size;
      } else {
        merged.push_back(c);
      }
    }
    r.chunks = merged;
  }
}

std::vector<model::BfcRegion> BfcReference::Regions() const { return regions_; }

}  // namespace fragscope::testing
