#include "model/free_size_index.h"

namespace fragscope::model {

void FreeSizeIndex::Add(std::uint64_t size) {
  ++count_;
  bytes_ += size;
  const int c = SizeClass(size);
  class_count_.Add(c, 1);
  class_bytes_.Add(c, static_cast<std::int64_t>(size));
  ++sizes_[size];
  const auto b = static_cast<std::size_t>(HistogramBucket(size));
  ++histogram_.count[b];
  histogram_.bytes[b] += size;
}

void FreeSizeIndex::Remove(std::uint64_t size) {
  --count_;
  bytes_ -= size;
  const int c = SizeClass(size);
  class_count_.Add(c, -1);
  class_bytes_.Add(c, -static_cast<std::int64_t>(size));
  auto it = sizes_.find(size);
  if (--it->second == 0) sizes_.erase(it);
  const auto b = static_cast<std::size_t>(HistogramBucket(size));
  --histogram_.count[b];
  histogram_.bytes[b] -= size;
}

std::uint64_t FreeSizeIndex::BytesBelow(std::uint64_t threshold) const {
  if (threshold == 0) return 0;
  const int c = SizeClass(threshold);
  std::uint64_t sum = class_bytes_.PrefixSum(c);
  // The sizes of class c below the threshold: at most the distinct sizes of one 1/64 octave.
  for (auto it = sizes_.lower_bound(ClassFloor(c)); it != sizes_.end() && it->first < threshold;
       ++it) {
    sum += it->first * it->second;
  }
  return sum;
}

std::uint64_t FreeSizeIndex::CountBelow(std::uint64_t threshold) const {
  if (threshold == 0) return 0;
  const int c = SizeClass(threshold);
  std::uint64_t sum = class_count_.PrefixSum(c);
  for (auto it = sizes_.lower_bound(ClassFloor(c)); it != sizes_.end() && it->first < threshold;
       ++it) {
    sum += it->second;
  }
  return sum;
}

}  // namespace fragscope::model
