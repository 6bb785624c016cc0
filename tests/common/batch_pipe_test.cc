// BatchPipe: every committed item reaches the consumer once, in order, on another thread;
// the consumer's first error stops it and comes back from Finish(), as does an exception.
#include "common/batch_pipe.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace fragscope {
namespace {

struct Item {
  std::uint64_t value = 0;
  std::string text;  // storage reused from one round to the next
};

void Produce(BatchPipe<Item>& pipe, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n && !pipe.failed(); ++i) {
    Item& slot = pipe.Slot();
    slot.value = i;
    slot.text = std::to_string(i);
    pipe.Commit();
  }
}

TEST(BatchPipeTest, DeliversEveryItemInOrderOnAnotherThread) {
  for (const std::size_t batch : {std::size_t{1}, std::size_t{3}, std::size_t{64}}) {
    for (const std::size_t depth : {std::size_t{1}, std::size_t{2}, std::size_t{4}}) {
      std::vector<std::uint64_t> seen;
      std::thread::id consumer_thread;
      bool texts_match = true;
      BatchPipe<Item> pipe(
          [&](std::span<Item> items) {
            consumer_thread = std::this_thread::get_id();
            for (const Item& item : items) {
              seen.push_back(item.value);
              texts_match &= item.text == std::to_string(item.value);
            }
            return Status::Ok();
          },
          batch, depth);
      // 1000 is not a multiple of 64 or 3: the last batch is partial.
      Produce(pipe, 1000);
      ASSERT_TRUE(pipe.Finish().ok());
      ASSERT_EQ(seen.size(), 1000u) << "batch " << batch << " depth " << depth;
      for (std::uint64_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], i);
      EXPECT_TRUE(texts_match);
      EXPECT_NE(consumer_thread, std::this_thread::get_id());
    }
  }
}

TEST(BatchPipeTest, NothingCommittedIsFine) {
  int calls = 0;
  BatchPipe<Item> pipe([&](std::span<Item>) {
    ++calls;
    return Status::Ok();
  });
  EXPECT_TRUE(pipe.Finish().ok());
  EXPECT_EQ(calls, 0);
  EXPECT_TRUE(pipe.Finish().ok()) << "a second Finish returns the same";
}

TEST(BatchPipeTest, FirstErrorStopsTheConsumerAndComesBack) {
  std::uint64_t last = 0;
  BatchPipe<Item> pipe(
      [&](std::span<Item> items) {
        for (const Item& item : items) {
          if (item.value == 500) return Status::Corruption("item 500 is bad");
          last = item.value;
        }
        return Status::Ok();
      },
      16, 2);
  Produce(pipe, 100000);
  const Status s = pipe.Finish();
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.message(), "item 500 is bad");
  EXPECT_EQ(last, 499u) << "nothing after the failing batch is consumed";
  EXPECT_TRUE(pipe.failed());
}

TEST(BatchPipeTest, ConsumerExceptionIsRethrownByFinish) {
  BatchPipe<Item> pipe(
      [&](std::span<Item> items) -> Status {
        for (const Item& item : items) {
          if (item.value == 70) throw std::runtime_error("consumer threw");
        }
        return Status::Ok();
      },
      8, 2);
  Produce(pipe, 1000);
  EXPECT_THROW((void)pipe.Finish(), std::runtime_error);
}

TEST(BatchPipeTest, DestructorFinishesWithoutAnExplicitCall) {
  std::uint64_t count = 0;
  {
    BatchPipe<Item> pipe(
        [&](std::span<Item> items) {
          count += items.size();
          return Status::Ok();
        },
        10, 3);
    Produce(pipe, 95);
  }
  EXPECT_EQ(count, 95u);
}

}  // namespace
}  // namespace fragscope
