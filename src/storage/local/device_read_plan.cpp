#include "storage/local/device_read_plan.hpp"

#include <algorithm>
#include <cassert>
#include <numeric>

#include "common/align.hpp"

namespace zerowait::internal {
namespace {

// Builds the slots one copy at a time.
class SlotPlanner {
 public:
  SlotPlanner(size_t slot_bytes, size_t alignment) : slot_bytes_(slot_bytes), align_(alignment) {}

  // Plans bytes [done, size) of `r` (request `index`), where `done` starts at 0.
  void add(const DeviceReadRequest& r, size_t index) {
    uint64_t done = 0;
    while (done < r.size) {
      const uint64_t position = r.offset + done;
      uint64_t taken = extend_last_read(position, r.size - done);
      if (taken == 0) taken = start_read(position, r.size - done);
      if (taken == 0) {  // the slot is full
        slots_.emplace_back();
        continue;
      }
      BounceSlot& slot = slots_.back();
      const BounceRead& read = slot.reads.back();
      slot.copies.push_back(
          {static_cast<size_t>(read.bounce_offset + (position - read.file_offset)),
           static_cast<size_t>(taken), static_cast<std::byte*>(r.device) + done, index, done});
      done += taken;
    }
  }

  std::vector<BounceSlot> take() {
    if (!slots_.empty() && slots_.back().reads.empty()) slots_.pop_back();
    return std::move(slots_);
  }

 private:
  // The bytes from `position` on (at most `wanted`) that the slot's last read holds or can be
  // grown to hold: a position in a block it covers or in the block right after it.
  uint64_t extend_last_read(uint64_t position, uint64_t wanted) {
    if (slots_.empty() || slots_.back().reads.empty()) return 0;
    BounceSlot& slot = slots_.back();
    BounceRead& read = slot.reads.back();
    const uint64_t read_end = read.file_offset + read.bytes;
    if (position < read.file_offset || align_down(position, align_) > read_end) return 0;
    const uint64_t room = align_down(slot_bytes_ - slot.bytes, align_);
    const uint64_t end = std::min(align_up(position + wanted, align_), read_end + room);
    if (end <= position) return 0;
    const uint64_t taken = std::min(wanted, end - position);
    if (end > read_end) {
      read.bytes = static_cast<size_t>(end - read.file_offset);
      slot.bytes = read.bounce_offset + read.bytes;
    }
    read.needed = std::max<size_t>(read.needed, position + taken - read.file_offset);
    return taken;
  }

  // A new read from the block holding `position`, as long as the slot has room for it.
  uint64_t start_read(uint64_t position, uint64_t wanted) {
    if (slots_.empty()) slots_.emplace_back();
    BounceSlot& slot = slots_.back();
    const uint64_t start = align_down(position, align_);
    const uint64_t skip = position - start;
    const uint64_t room = align_down(slot_bytes_ - slot.bytes, align_);
    if (room == 0) return 0;
    const uint64_t bytes = std::min(align_up(skip + wanted, align_), room);
    const uint64_t taken = std::min(wanted, bytes - skip);
    slot.reads.push_back(
        {start, slot.bytes, static_cast<size_t>(bytes), static_cast<size_t>(skip + taken)});
    slot.bytes += bytes;
    return taken;
  }

  const size_t slot_bytes_;
  const size_t align_;
  std::vector<BounceSlot> slots_;
};

}  // namespace

std::vector<BounceSlot> plan_bounce_slots(std::span<const DeviceReadRequest> requests,
                                          size_t slot_bytes, size_t alignment) {
  assert(alignment > 0 && slot_bytes >= 2 * alignment && slot_bytes % alignment == 0);
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return requests[a].offset < requests[b].offset; });
  SlotPlanner planner(slot_bytes, alignment);
  for (const size_t i : order) planner.add(requests[i], i);
  return planner.take();
}

}  // namespace zerowait::internal
