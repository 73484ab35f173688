#include "loader/block_window.hpp"

#include <algorithm>
#include <string>
#include <thread>

#include "common/align.hpp"
#include "common/thread_pool.hpp"
#include "host/thread_placement.hpp"

namespace zerowait {

namespace {

// Blocks of a window come from many shards, one request each: their reads run on this many
// threads at once so the device sees a deep queue, as it would for one large sequential read.
constexpr size_t kMaxParallelSources = 16;

// The file bytes read for a block: its own, widened to whole aligned blocks where the source
// bypasses the page cache (the source reads a file's unaligned tail itself).
std::pair<uint64_t, uint64_t> read_span(const BlockWindow::Want& want) {
  if (!want.source->bypasses_page_cache()) return {want.offset, want.offset + want.length};
  return {internal::align_down(want.offset, kDirectIoAlignment),
          std::min(want.source->size(),
                   internal::align_up(want.offset + want.length, kDirectIoAlignment))};
}

// Blocks of one shard differ in length by up to a sample: an eighth more than its first block
// lets a buffer serve the blocks after it, at a small cost in memory.
uint64_t buffer_capacity(uint64_t length) { return length + length / 8; }

}  // namespace

Status BlockWindow::acquire(std::span<const Want> wants, Deadline deadline,
                            std::vector<std::shared_ptr<const WindowBlock>>* out,
                            uint64_t* bytes_read) {
  out->assign(wants.size(), nullptr);
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    std::vector<size_t> mine;  // wants this call reads
    bool others_reading = false;
    for (size_t i = 0; i < wants.size(); ++i) {
      if ((*out)[i] != nullptr) continue;
      const Key key{wants[i].shard, wants[i].block};
      auto [it, inserted] = blocks_.try_emplace(key);
      if (inserted) {
        mine.push_back(i);
      } else if (it->second.block != nullptr) {
        (*out)[i] = it->second.block;
        recent_.splice(recent_.begin(), recent_, it->second.place);
      } else {
        others_reading = true;  // or this call, for a block wanted twice: found next round
      }
    }
    if (!mine.empty()) {
      std::vector<const Want*> to_read;
      uint64_t incoming = 0;
      for (size_t i : mine) {
        to_read.push_back(&wants[i]);
        const auto [begin, end] = read_span(wants[i]);
        incoming += end - begin;
      }
      // Room first, so that the blocks leaving the window lend their memory to these reads.
      evict_locked(incoming);
      std::vector<std::shared_ptr<WindowBlock>> read;
      for (const Want* want : to_read) {
        const auto [begin, end] = read_span(*want);
        read.push_back(take_spare_locked(end - begin));
      }
      lock.unlock();
      Status status = read_blocks(to_read, deadline, read, bytes_read);
      lock.lock();
      for (size_t j = 0; j < mine.size(); ++j) {
        const Key key{wants[mine[j]].shard, wants[mine[j]].block};
        if (!status.is_ok()) {
          blocks_.erase(key);  // a waiter reads it itself
          continue;
        }
        Entry& entry = blocks_.at(key);
        entry.block = std::move(read[j]);
        recent_.push_front(key);
        entry.place = recent_.begin();
        resident_bytes_ += entry.block->length;
        (*out)[mine[j]] = entry.block;
      }
      changed_.notify_all();
      evict_locked(0);
      ZW_RETURN_IF_ERROR(status);
      continue;
    }
    if (!others_reading) return Status::ok();
    if (deadline.passed()) {
      for (size_t i = 0; i < wants.size(); ++i) {
        if ((*out)[i] != nullptr) continue;
        return Status(ErrorCode::kDeadlineExceeded,
                      "deadline passed while another loader thread was reading block " +
                          std::to_string(wants[i].block) + " of '" + wants[i].source->name() +
                          "' (offset " + std::to_string(wants[i].offset) + ", " +
                          std::to_string(wants[i].length) + " bytes)");
      }
    }
    // Bounded waits: Deadline::none() is the time_point's maximum.
    const auto next_look = std::min(deadline.at, Clock::now() + std::chrono::milliseconds(100));
    changed_.wait_until(lock, next_look);
  }
}

Status BlockWindow::read_blocks(std::span<const Want* const> wants, Deadline deadline,
                                std::span<const std::shared_ptr<WindowBlock>> read,
                                uint64_t* bytes_read) {
  // One request per block.
  std::vector<ReadRequest> requests(wants.size());
  for (size_t j = 0; j < wants.size(); ++j) {
    const Want& want = *wants[j];
    const auto [begin, end] = read_span(want);
    WindowBlock* block = read[j].get();
    Status reserved = Status::ok();
    if (memory_node_ >= 0 && block->memory.node() != memory_node_) {
      reserved = block->memory.bind_to_node(memory_node_);
    }
    if (reserved.is_ok()) {
      reserved = block->memory.reserve(end - begin, buffer_capacity(end - begin), /*pin=*/false,
                                       internal::AlignedBuffer::Touch::kByFirstWrite);
    }
    if (!reserved.is_ok()) {
      return Status(reserved.code(),
                    reserved.message() + " (block " + std::to_string(want.block) + " of '" +
                        want.source->name() + "')");
    }
    block->offset = begin;
    block->length = end - begin;
    requests[j] = {begin, {block->memory.data(), end - begin}};
  }

  // Requests of one source go together; sources are read on parallel threads.
  std::vector<size_t> order(wants.size());
  for (size_t j = 0; j < order.size(); ++j) order[j] = j;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return wants[a]->source < wants[b]->source; });
  struct Group {
    ByteSource* source;
    std::vector<ReadRequest> requests;
    Status status;
  };
  std::vector<Group> groups;
  for (size_t j : order) {
    if (groups.empty() || groups.back().source != wants[j]->source) {
      groups.push_back({wants[j]->source, {}, Status::ok()});
    }
    groups.back().requests.push_back(requests[j]);
    *bytes_read += requests[j].dst.size();
  }
  auto read_groups = [&](size_t first, size_t stride) {
    for (size_t g = first; g < groups.size(); g += stride) {
      groups[g].status = groups[g].source->read(groups[g].requests, deadline);
    }
  };
  const size_t threads = std::min(groups.size(), kMaxParallelSources);
  Status started = Status::ok();
  if (threads <= 1) {
    read_groups(0, 1);
  } else {
    const internal::ThreadPlacement placement{"zw-block-read", reader_cpus_};
    std::vector<std::thread> readers;
    for (size_t t = 1; t < threads && started.is_ok(); ++t) {
      Result<std::thread> reader = internal::start_thread(
          placement, [&read_groups, t, threads] { read_groups(t, threads); });
      if (reader.is_ok()) {
        readers.push_back(std::move(reader).value());
      } else {
        started = reader.status();
      }
    }
    if (started.is_ok()) read_groups(0, threads);
    for (std::thread& reader : readers) reader.join();
  }
  ZW_RETURN_IF_ERROR(started);
  for (const Group& group : groups) ZW_RETURN_IF_ERROR(group.status);
  return Status::ok();
}

std::shared_ptr<WindowBlock> BlockWindow::take_spare_locked(uint64_t bytes) {
  // The first spare that fits; any other would be freed and allocated anew by reserve().
  auto fits = std::find_if(spare_.begin(), spare_.end(), [&](const auto& block) {
    return block->memory.capacity() >= bytes;
  });
  if (fits == spare_.end()) {
    ++buffers_allocated_;
    return std::make_shared<WindowBlock>();
  }
  std::shared_ptr<WindowBlock> block = std::move(*fits);
  *fits = std::move(spare_.back());
  spare_.pop_back();
  spare_bytes_ -= block->length;
  return block;
}

BlockWindow::Memory BlockWindow::memory() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {resident_bytes_, spare_bytes_, buffers_allocated_};
}

void BlockWindow::evict_locked(uint64_t incoming) {
  while (resident_bytes_ + incoming > budget_bytes_ && !recent_.empty()) {
    auto it = blocks_.find(recent_.back());
    std::shared_ptr<WindowBlock> block = std::move(it->second.block);
    resident_bytes_ -= block->length;
    blocks_.erase(it);
    recent_.pop_back();
    // Kept while resident and spare blocks together stay within the budget. A block in use by
    // a builder is freed with its last user instead.
    if (block.use_count() == 1 && resident_bytes_ + spare_bytes_ + block->length <= budget_bytes_) {
      spare_bytes_ += block->length;
      spare_.push_back(std::move(block));
    }
  }
}

}  // namespace zerowait
