// Prefaulter: faults in the pages of freshly allocated memory on a background thread, ahead of
// the thread that will write them. The first write to a fresh 4 KiB page costs the kernel a
// page allocation and a clear; on this project's VMs that was 39% of the time of a reader that
// fills hundreds of MB (docs/benchmarks.md, "Loading and analyzing a large snapshot"). Moving
// it to the second core takes it off the reader's path.
//
// Linux's MADV_POPULATE_WRITE (5.14 and later) faults pages in without changing their
// contents, so it is safe on memory another thread is writing, and on memory unmapped or
// remapped meanwhile (the call fails or populates the new mapping; either is harmless, the
// latter costs only resident memory). Where it is unavailable, Populate() does nothing.
//
// Thread safety: Populate() and Drain() may be called from any one thread at a time.
#ifndef FRAGSCOPE_COMMON_PREFAULTER_H_
#define FRAGSCOPE_COMMON_PREFAULTER_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

namespace fragscope {

class Prefaulter {
 public:
  Prefaulter() = default;
  Prefaulter(const Prefaulter&) = delete;
  Prefaulter& operator=(const Prefaulter&) = delete;
  /// Drops the queued requests and the rest of the one under way, and stops the worker.
  ~Prefaulter();

  /// Queues [begin, begin + bytes) to be faulted in for writing; returns at once. The worker
  /// thread starts on the first call.
  void Populate(const void* begin, std::size_t bytes);
  /// Waits until every queued request has been carried out.
  void Drain();
  /// Whether this system can populate at all (false also after the first failed attempt).
  bool supported() const { return supported_.load(std::memory_order_relaxed); }

 private:
  void Work();

  std::mutex mu_;
  std::condition_variable wake_;  // work queued, or stopping
  std::condition_variable idle_;  // the queue ran empty
  std::deque<std::pair<std::uintptr_t, std::size_t>> queue_;
  bool busy_ = false;              // the worker is carrying out a request
  std::atomic<bool> stop_{false};  // also read by the worker between steps of a request
  std::atomic<bool> supported_{true};
  std::thread worker_;
};

}  // namespace fragscope

#endif  // FRAGSCOPE_COMMON_PREFAULTER_H_
