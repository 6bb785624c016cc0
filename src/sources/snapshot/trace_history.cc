// TraceHistory: see trace_history.h for the encoding.
#include "sources/snapshot/trace_history.h"

#include <utility>

namespace fragscope::sources {
namespace {

constexpr std::uint8_t kActionMask = 0x0f;
constexpr std::uint8_t kStackSame = 0x10;
constexpr std::uint8_t kStreamSame = 0x20;
constexpr std::uint8_t kEntryNext = 0x40;
constexpr std::uint8_t kDeviceFree = 0x80;

void PutVarint(std::vector<std::uint8_t>* out, std::uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<std::uint8_t>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<std::uint8_t>(v));
}

// Zigzag of the wrapping difference now - before, read as a signed 64-bit value.
std::uint64_t ZigzagDelta(std::uint64_t now, std::uint64_t before) {
  const std::uint64_t d = now - before;
  return (d << 1) ^ (0 - (d >> 63));
}

std::uint64_t GetVarint(const std::uint8_t*& p) {
  std::uint64_t v = *p & 0x7f;
  int shift = 7;
  while (*p++ & 0x80) {
    v |= static_cast<std::uint64_t>(*p & 0x7f) << shift;
    shift += 7;
  }
  return v;
}

std::uint64_t Unzigzag(std::uint64_t z) { return (z >> 1) ^ (0 - (z & 1)); }

}  // namespace

void TraceHistory::push_back(const SnapshotTraceEntry& e) {
  if (size_ % kChunkEntries == 0) {
    if (!chunks_.empty()) {
      chunks_.back().shrink_to_fit();
      sealed_bytes_ += chunks_.back().capacity();
    }
    chunks_.emplace_back();
    chunks_.back().reserve(kChunkEntries * 12);
    state_ = State();
  }
  std::vector<std::uint8_t>& out = chunks_.back();
  std::uint8_t flags = static_cast<std::uint8_t>(e.action) & kActionMask;
  if (e.stack == state_.stack) flags |= kStackSame;
  if (e.stream == state_.stream) flags |= kStreamSame;
  if (e.entry == state_.entry + 1) flags |= kEntryNext;
  if (e.device_free != 0) flags |= kDeviceFree;
  out.push_back(flags);
  PutVarint(&out, ZigzagDelta(e.addr, state_.addr));
  PutVarint(&out, ZigzagDelta(e.size, state_.size));
  const auto time = static_cast<std::uint64_t>(e.time_us);
  PutVarint(&out, ZigzagDelta(time, state_.time));
  if ((flags & kStackSame) == 0) {
    // Sign-extended, so that -1 (none) next to a small index is a small delta.
    PutVarint(&out, ZigzagDelta(static_cast<std::uint64_t>(std::int64_t{e.stack}),
                                static_cast<std::uint64_t>(std::int64_t{state_.stack})));
  }
  if ((flags & kStreamSame) == 0) PutVarint(&out, e.stream);
  if ((flags & kEntryNext) == 0) PutVarint(&out, ZigzagDelta(e.entry, state_.entry));
  if ((flags & kDeviceFree) != 0) PutVarint(&out, e.device_free);
  state_.addr = e.addr;
  state_.size = e.size;
  state_.time = time;
  state_.stack = e.stack;
  state_.stream = e.stream;
  state_.entry = e.entry;
  ++size_;
}

std::uint64_t TraceHistory::bytes() const {
  return sealed_bytes_ + (chunks_.empty() ? 0 : chunks_.back().capacity()) +
         chunks_.capacity() * sizeof(std::vector<std::uint8_t>) +
         (stack_map_ ? stack_map_->capacity() * sizeof(std::int32_t) : 0);
}

SnapshotTraceEntry TraceHistory::Decode(std::size_t c, std::size_t count,
                                        SnapshotTraceEntry* out) const {
  const std::uint8_t* p = chunks_[c].data();
  State s;
  SnapshotTraceEntry e;
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint8_t flags = *p++;
    e.action = static_cast<Action>(flags & kActionMask);
    s.addr += Unzigzag(GetVarint(p));
    s.size += Unzigzag(GetVarint(p));
    s.time += Unzigzag(GetVarint(p));
    if ((flags & kStackSame) == 0) {
      s.stack = static_cast<std::int32_t>(static_cast<std::uint32_t>(s.stack) +
                                          static_cast<std::uint32_t>(Unzigzag(GetVarint(p))));
    }
    if ((flags & kStreamSame) == 0) s.stream = GetVarint(p);
    s.entry = (flags & kEntryNext) != 0
                  ? s.entry + 1
                  : s.entry + static_cast<std::uint32_t>(Unzigzag(GetVarint(p)));
    e.device_free = (flags & kDeviceFree) != 0 ? GetVarint(p) : 0;
    e.addr = s.addr;
    e.size = s.size;
    e.time_us = static_cast<std::int64_t>(s.time);
    e.stack =
        s.stack >= 0 && stack_map_ ? (*stack_map_)[static_cast<std::size_t>(s.stack)] : s.stack;
    e.stream = s.stream;
    e.entry = s.entry;
    if (out != nullptr) out[i] = e;
  }
  return e;
}

void TraceHistory::DecodeChunk(std::size_t c, std::vector<SnapshotTraceEntry>* out) const {
  const std::size_t first = c * kChunkEntries;
  const std::size_t count = first + kChunkEntries <= size_ ? kChunkEntries : size_ - first;
  out->resize(count);
  Decode(c, count, out->data());
}

SnapshotTraceEntry TraceHistory::operator[](std::size_t i) const {
  return Decode(i / kChunkEntries, i % kChunkEntries + 1, nullptr);
}

void TraceHistory::MapStacks(std::shared_ptr<const std::vector<std::int32_t>> map) {
  if (stack_map_) {
    // Compose: the old map first, then the new one.
    auto composed = std::make_shared<std::vector<std::int32_t>>(*stack_map_);
    for (std::int32_t& s : *composed) s = s >= 0 ? (*map)[static_cast<std::size_t>(s)] : s;
    stack_map_ = std::move(composed);
  } else {
    stack_map_ = std::move(map);
  }
}

TraceHistory::const_iterator::const_iterator(const TraceHistory* history, std::size_t index)
    : history_(history), index_(index) {
  if (history_ != nullptr && index_ < history_->size()) {
    history_->DecodeChunk(index_ / kChunkEntries, &buffer_);
  }
}

TraceHistory::const_iterator& TraceHistory::const_iterator::operator++() {
  ++index_;
  if (index_ % kChunkEntries == 0 && index_ < history_->size()) {
    history_->DecodeChunk(index_ / kChunkEntries, &buffer_);
  }
  return *this;
}

}  // namespace fragscope::sources
