// BatchPipe<Item>: hands items from the thread that makes them to one consumer thread, in
// order and in batches, so that two stages of a pipeline run on two cores — `fragscope replay`
// simulates on one while the analysis of the simulated events runs on the other.
//
// The producer fills a slot (Slot), then commits it (Commit); a full batch is handed over at
// once, the last partial one by Finish(). The consumer gets whole batches, oldest first, and
// returns a Status; after its first error it gets nothing more, failed() turns true, and
// Finish() returns that error. A batch is reused once consumed, so items keep their storage
// (strings, vectors) from one round to the next. The producer blocks while `depth` batches wait.
//
// An exception thrown by the consumer is caught on its thread and rethrown by Finish() on the
// producer's, as if the consumer had run there.
//
// Thread safety: Slot, Commit, failed and Finish belong to the producer thread.
#ifndef FRAGSCOPE_COMMON_BATCH_PIPE_H_
#define FRAGSCOPE_COMMON_BATCH_PIPE_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "fragscope/status.h"

namespace fragscope {

template <typename Item>
class BatchPipe {
 public:
  using Consumer = std::function<Status(std::span<Item>)>;

  /// Starts the consumer thread. REQUIRES: batch_items >= 1, depth >= 1.
  explicit BatchPipe(Consumer consumer, std::size_t batch_items = 2048, std::size_t depth = 4)
      : consumer_(std::move(consumer)),
        batches_(depth, std::vector<Item>(batch_items)),
        fill_(depth, 0) {
    worker_ = std::thread([this] { Work(); });
  }
  BatchPipe(const BatchPipe&) = delete;
  BatchPipe& operator=(const BatchPipe&) = delete;
  /// Finishes (hands over what is queued and waits for it) unless Finish() was called; an error
  /// or exception of the consumer is then dropped.
  ~BatchPipe() {
    if (worker_.joinable()) {
      try {
        (void)Finish();
      } catch (...) {  // nothing to tell it to from a destructor
      }
    }
  }

  /// The slot the next Commit() hands on; its previous contents are those of an item consumed
  /// earlier (or default-constructed).
  Item& Slot() { return batches_[written_ % batches_.size()][used_]; }
  void Commit() {
    if (++used_ == batches_[0].size()) Handover();
  }

  /// The consumer has failed: further items will be dropped; stop producing and call Finish().
  bool failed() const { return failed_.load(std::memory_order_relaxed); }

  /// Hands over the partial batch, waits until everything handed over was consumed (or the
  /// consumer failed), stops the thread and returns the consumer's first error. Rethrows what
  /// the consumer threw. Afterwards the pipe takes nothing more.
  Status Finish() {
    if (!worker_.joinable()) return status_;
    if (used_ > 0) Handover();
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    ready_.notify_one();
    worker_.join();
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return status_;
  }

 private:
  void Handover() {
    std::unique_lock<std::mutex> lock(mu_);
    fill_[written_ % batches_.size()] = used_;
    ++written_;
    used_ = 0;
    ready_.notify_one();
    // The next batch to fill must have been consumed.
    room_.wait(lock, [&] { return written_ - consumed_ < batches_.size(); });
  }

  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ready_.wait(lock, [&] { return consumed_ < written_ || closed_; });
      if (consumed_ == written_) return;  // closed and drained
      std::vector<Item>& batch = batches_[consumed_ % batches_.size()];
      const std::size_t n = fill_[consumed_ % batches_.size()];
      lock.unlock();
      if (!failed_.load(std::memory_order_relaxed)) {
        try {
          Status s = consumer_(std::span<Item>(batch.data(), n));
          if (!s.ok()) {
            status_ = std::move(s);
            failed_.store(true, std::memory_order_relaxed);
          }
        } catch (...) {
          error_ = std::current_exception();
          failed_.store(true, std::memory_order_relaxed);
        }
      }
      lock.lock();
      ++consumed_;
      room_.notify_one();
    }
  }

  Consumer consumer_;
  std::vector<std::vector<Item>> batches_;
  std::vector<std::size_t> fill_;  // items in each handed-over batch
  std::size_t used_ = 0;           // producer: items in the batch being filled
  std::mutex mu_;
  std::condition_variable ready_;  // a batch was handed over, or the pipe closed
  std::condition_variable room_;   // a batch was consumed
  std::uint64_t written_ = 0;      // batches handed over (guarded by mu_)
  std::uint64_t consumed_ = 0;     // batches consumed (guarded by mu_)
  bool closed_ = false;            // guarded by mu_
  std::atomic<bool> failed_{false};
  // Written by the consumer thread, read by Finish() after the join.
  Status status_;
  std::exception_ptr error_;
  std::thread worker_;
};

}  // namespace fragscope

#endif  // FRAGSCOPE_COMMON_BATCH_PIPE_H_
