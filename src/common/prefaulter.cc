#include "common/prefaulter.h"

#include <algorithm>
#include <cerrno>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace fragscope {

namespace {

constexpr std::uintptr_t kPage = 4096;
// One madvise call at a time, so that a request racing a remap or a free fails in small pieces.
constexpr std::size_t kStep = std::size_t{2} << 20;

// Faults [begin, end) in, until `stop`; false when the system cannot (no MADV_POPULATE_WRITE).
bool PopulateRange(std::uintptr_t begin, std::uintptr_t end, const std::atomic<bool>& stop) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  for (std::uintptr_t at = begin; at < end && !stop.load(std::memory_order_relaxed); at += kStep) {
    const std::size_t len = std::min<std::uintptr_t>(kStep, end - at);
    // NOLINTNEXTLINE(performance-no-int-to-ptr): an address range, not an object
    if (madvise(reinterpret_cast<void*>(at), len, MADV_POPULATE_WRITE) != 0 &&
        (errno == EINVAL || errno == ENOSYS)) {
      return false;  // an old kernel: the advice is unknown
    }
    // Other failures (ENOMEM for a range unmapped meanwhile, EFAULT, ...) only mean that the
    // memory is no longer there to warm.
  }
  return true;
#else
  (void)begin;
  (void)end;
  (void)stop;
  return false;
#endif
}

}  // namespace

Prefaulter::~Prefaulter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_relaxed);
    queue_.clear();  // warming memory nobody will write is wasted
  }
  wake_.notify_one();
  if (worker_.joinable()) worker_.join();
}

void Prefaulter::Populate(const void* begin, std::size_t bytes) {
  if (!supported() || bytes == 0) return;
  // Whole pages inside the range only: the pages at its ends may belong to other objects.
  const auto first = (reinterpret_cast<std::uintptr_t>(begin) + kPage - 1) & ~(kPage - 1);
  const auto last = (reinterpret_cast<std::uintptr_t>(begin) + bytes) & ~(kPage - 1);
  if (last <= first) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!worker_.joinable()) worker_ = std::thread([this] { Work(); });
    queue_.emplace_back(first, last - first);
  }
  wake_.notify_one();
}

void Prefaulter::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
}

void Prefaulter::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const auto [begin, bytes] = queue_.front();
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    const bool ok = supported() && PopulateRange(begin, begin + bytes, stop_);
    if (!ok) supported_.store(false, std::memory_order_relaxed);
    lock.lock();
    busy_ = false;
    if (queue_.empty()) idle_.notify_all();
  }
}

}  // namespace fragscope
