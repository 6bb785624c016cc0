// TraceHistory: see trace_history.h for the encoding.
#include "sources/snapshot/trace_history.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace fragscope::sources {
namespace {

// An entry: a 16-bit header, then addr, size and time_us deltas (zigzag, wrapping) in the
// widths the header gives, then the stack's delta (zigzag of the 32-bit difference) unless it
// is the same, then, when kHistoryExtra is set, a byte of kHistoryExtra* flags and the varints they
// name. Fixed widths decode without a loop: a field is one unaligned 8-byte load and a mask, which
// the 8 zero bytes that end every chunk make safe.
constexpr unsigned kHistoryActionBits = 0x000f;
constexpr unsigned kHistoryExtra = 0x0010;
constexpr unsigned kHistoryAddrShift = 5;    // 3 bits: width - 1 (1-8 bytes)
constexpr unsigned kHistorySizeShift = 8;    // 3 bits: width - 1
constexpr unsigned kHistoryTimeShift = 11;   // 2 bits: 1, 2, 4 or 8 bytes
constexpr unsigned kHistoryStackShift = 13;  // 2 bits: same (0 bytes), 1, 2 or 4 bytes
constexpr std::uint8_t kExtraStream = 1, kExtraEntry = 2, kExtraDeviceFree = 4;
constexpr std::size_t kHistoryPadding = 8;

constexpr std::uint64_t kHistoryWidthMask[9] = {0,
                                                0xff,
                                                0xffff,
                                                0xffffff,
                                                0xffffffff,
                                                0xffffffffff,
                                                0xffffffffffff,
                                                0xffffffffffffff,
                                                ~std::uint64_t{0}};
constexpr std::uint8_t kHistoryTimeWidth[4] = {1, 2, 4, 8};   // time
constexpr std::uint8_t kHistoryStackWidth[4] = {0, 1, 2, 4};  // stack

// Zigzag of the wrapping difference now - before, read as a signed 64-bit value.
std::uint64_t HistoryZigzagDelta(std::uint64_t now, std::uint64_t before) {
  const std::uint64_t d = now - before;
  return (d << 1) ^ (0 - (d >> 63));
}
std::uint64_t HistoryUnzigzag(std::uint64_t z) { return (z >> 1) ^ (0 - (z & 1)); }

unsigned HistoryBytesOf(std::uint64_t v) {
  unsigned n = 1;
  while (n < 8 && (v >> (8 * n)) != 0) ++n;
  return n;
}

std::uint8_t* PutHistoryFixed(std::uint8_t* p, std::uint64_t v, unsigned width) {
  for (unsigned i = 0; i < width; ++i) *p++ = static_cast<std::uint8_t>(v >> (8 * i));
  return p;
}

std::uint8_t* PutHistoryVarint(std::uint8_t* p, std::uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<std::uint8_t>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<std::uint8_t>(v);
  return p;
}

std::uint64_t GetHistoryFixed(const std::uint8_t*& p, unsigned width) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);  // within the chunk's padding at worst
  p += width;
  return v & kHistoryWidthMask[width];
}

std::uint64_t GetHistoryVarint(const std::uint8_t*& p) {
  std::uint64_t v = *p & 0x7f;
  int shift = 7;
  while (*p++ & 0x80) {
    v |= static_cast<std::uint64_t>(*p & 0x7f) << shift;
    shift += 7;
  }
  return v;
}

}  // namespace

void TraceHistory::push_back(const SnapshotTraceEntry& e) {
  if (size_ % kChunkEntries == 0) {
    if (!chunks_.empty()) {
      chunks_.back().shrink_to_fit();
      sealed_bytes_ += chunks_.back().capacity();
    }
    chunks_.emplace_back();
    chunks_.back().resize(kHistoryPadding);
    state_ = State();
  }
  std::uint8_t buf[2 + 8 + 8 + 8 + 4 + 1 + 3 * 10];
  std::uint8_t* p = buf + 2;
  unsigned header = static_cast<unsigned>(e.action) & kHistoryActionBits;
  const std::uint64_t addr = HistoryZigzagDelta(e.addr, state_.addr);
  const unsigned addr_width = HistoryBytesOf(addr);
  header |= (addr_width - 1) << kHistoryAddrShift;
  p = PutHistoryFixed(p, addr, addr_width);
  const std::uint64_t size = HistoryZigzagDelta(e.size, state_.size);
  const unsigned size_width = HistoryBytesOf(size);
  header |= (size_width - 1) << kHistorySizeShift;
  p = PutHistoryFixed(p, size, size_width);
  const auto time = static_cast<std::uint64_t>(e.time_us);
  const std::uint64_t time_delta = HistoryZigzagDelta(time, state_.time);
  const unsigned time_bytes = HistoryBytesOf(time_delta);
  const unsigned time_class = time_bytes <= 1 ? 0 : time_bytes <= 2 ? 1 : time_bytes <= 4 ? 2 : 3;
  header |= time_class << kHistoryTimeShift;
  p = PutHistoryFixed(p, time_delta, kHistoryTimeWidth[time_class]);
  if (e.stack != state_.stack) {
    // The 32-bit difference, zigzagged: at most 4 bytes.
    const std::uint32_t d =
        static_cast<std::uint32_t>(e.stack) - static_cast<std::uint32_t>(state_.stack);
    const std::uint32_t z = (d << 1) ^ (0u - (d >> 31));
    const unsigned stack_class = z <= 0xff ? 1 : z <= 0xffff ? 2 : 3;
    header |= stack_class << kHistoryStackShift;
    p = PutHistoryFixed(p, z, kHistoryStackWidth[stack_class]);
  }
  if (e.stack >= 0) NoteStack(e.stack);
  std::uint8_t extra = 0;
  if (e.stream != state_.stream) extra |= kExtraStream;
  if (e.entry != state_.entry + 1) extra |= kExtraEntry;
  if (e.device_free != 0) extra |= kExtraDeviceFree;
  if (extra != 0) {
    header |= kHistoryExtra;
    *p++ = extra;
    if ((extra & kExtraStream) != 0) p = PutHistoryVarint(p, e.stream);
    if ((extra & kExtraEntry) != 0)
      p = PutHistoryVarint(p, HistoryZigzagDelta(e.entry, state_.entry));
    if ((extra & kExtraDeviceFree) != 0) p = PutHistoryVarint(p, e.device_free);
  }
  buf[0] = static_cast<std::uint8_t>(header);
  buf[1] = static_cast<std::uint8_t>(header >> 8);
  std::vector<std::uint8_t>& out = chunks_.back();
  out.insert(out.end() - kHistoryPadding, buf, p);
  state_.addr = e.addr;
  state_.size = e.size;
  state_.time = time;
  state_.stack = e.stack;
  state_.stream = e.stream;
  state_.entry = e.entry;
  ++size_;
}

void TraceHistory::NoteStack(std::int32_t stack) {
  const auto s = static_cast<std::size_t>(stack);
  if (s >= stack_seen_.size()) {
    // Stack ids are dense (an intern table's): the bitmap follows them, within a bound that
    // a file cannot stretch (an id beyond it is listed each time it comes).
    if (s >= 4 * size_ + 65536) {
      first_stacks_.push_back(stack);
      return;
    }
    stack_seen_.resize(std::max(s + 1, 2 * stack_seen_.size()));
  }
  if (!stack_seen_[s]) {
    stack_seen_[s] = true;
    first_stacks_.push_back(stack);
  }
}

std::uint64_t TraceHistory::bytes() const {
  return sealed_bytes_ + (chunks_.empty() ? 0 : chunks_.back().capacity()) +
         chunks_.capacity() * sizeof(std::vector<std::uint8_t>) +
         (stack_map_ ? stack_map_->capacity() * sizeof(std::int32_t) : 0) +
         first_stacks_.capacity() * sizeof(std::int32_t) + stack_seen_.capacity() / 8;
}

SnapshotTraceEntry TraceHistory::Decode(std::size_t c, std::size_t count,
                                        SnapshotTraceEntry* out) const {
  const std::uint8_t* p = chunks_[c].data();
  State s;
  SnapshotTraceEntry e;
  const std::vector<std::int32_t>* map = stack_map_.get();
  for (std::size_t i = 0; i < count; ++i) {
    const unsigned header = p[0] | (unsigned{p[1]} << 8);
    p += 2;
    e.action = static_cast<Action>(header & kHistoryActionBits);
    s.addr += HistoryUnzigzag(GetHistoryFixed(p, ((header >> kHistoryAddrShift) & 7) + 1));
    s.size += HistoryUnzigzag(GetHistoryFixed(p, ((header >> kHistorySizeShift) & 7) + 1));
    s.time +=
        HistoryUnzigzag(GetHistoryFixed(p, kHistoryTimeWidth[(header >> kHistoryTimeShift) & 3]));
    if (const unsigned stack_class = (header >> kHistoryStackShift) & 3; stack_class != 0) {
      const auto z =
          static_cast<std::uint32_t>(GetHistoryFixed(p, kHistoryStackWidth[stack_class]));
      const std::uint32_t d = (z >> 1) ^ (0u - (z & 1));
      s.stack = static_cast<std::int32_t>(static_cast<std::uint32_t>(s.stack) + d);
    }
    e.device_free = 0;
    if ((header & kHistoryExtra) != 0) {
      const std::uint8_t extra = *p++;
      if ((extra & kExtraStream) != 0) s.stream = GetHistoryVarint(p);
      s.entry = (extra & kExtraEntry) != 0
                    ? s.entry + static_cast<std::uint32_t>(HistoryUnzigzag(GetHistoryVarint(p)))
                    : s.entry + 1;
      if ((extra & kExtraDeviceFree) != 0) e.device_free = GetHistoryVarint(p);
    } else {
      ++s.entry;
    }
    e.addr = s.addr;
    e.size = s.size;
    e.time_us = static_cast<std::int64_t>(s.time);
    e.stack = s.stack >= 0 && map != nullptr ? (*map)[static_cast<std::size_t>(s.stack)] : s.stack;
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
