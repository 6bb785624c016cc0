// RecordedAddresses: the addresses a real CUDA driver gave the segments of a recorded run, handed
// back, in the order they were recorded, to a simulator that replays the run
// (DriverModel::segment_address; `fragscope replay --addresses recorded`).
//
// The simulator's own address policy places segments elsewhere than the driver did, and where a
// request fits equally well in free blocks of two segments, the allocator takes the block with
// the lower address: with other addresses a replay can break such ties the other way. At the
// recorded addresses it meets the same ties as the real run.
//
// A segment is matched by size: the simulator's n-th cudaMalloc of S bytes gets the n-th recorded
// segment of S bytes, so a simulation that makes the same segments in the same order gets the
// same addresses; one that does not gets whatever address of that size is next, or none, and
// the simulator refuses an address that is in use (it then places the segment itself, above
// every recorded segment: base()).
//
// Thread safety: Add builds, one thread. Once built, Attach may be called from several threads:
// each attached DriverModel (and each copy of one) hands the addresses out with cursors of its
// own over a shared, read-only table, so simulators replaying in parallel do not meet.
#ifndef FRAGSCOPE_MODEL_RECORDED_ADDRESSES_H_
#define FRAGSCOPE_MODEL_RECORDED_ADDRESSES_H_

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "model/caching_allocator_sim.h"

namespace fragscope::model {

class RecordedAddresses {
 public:
  /// A segment the real driver gave `addr` for `bytes` (segment_alloc), in recorded order.
  void Add(std::uint64_t bytes, std::uint64_t addr);
  /// The end of the highest recorded segment rounded up to 2 MiB, for DriverModel::address_base:
  /// the simulator's own segments go above every recorded one (0 when nothing was recorded, or
  /// when the recorded ranges reach 2^47, where the simulator keeps its default).
  std::uint64_t base() const;
  std::uint64_t recorded() const { return recorded_; }
  /// Sets `driver`'s address_base and its segment_address, which answers a cudaMalloc of S
  /// bytes with the next recorded address of a segment of S bytes, from the first, and 0 when
  /// none is left. The answers do not depend on this object after the call.
  void Attach(DriverModel* driver) const;

 private:
  using Table = std::unordered_map<std::uint64_t, std::vector<std::uint64_t>>;
  // Copied on write once shared, so that what Attach handed out never changes.
  std::shared_ptr<Table> by_size_;
  std::uint64_t end_ = 0;  // of the highest recorded range
  std::uint64_t recorded_ = 0;
};

}  // namespace fragscope::model

#endif  // FRAGSCOPE_MODEL_RECORDED_ADDRESSES_H_
