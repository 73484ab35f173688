#include "loader/block_window.hpp"

#include <algorithm>
#include <string>
#include <thread>

#include "common/align.hpp"

namespace zerowait {

namespace {

// Blocks of a window come from many shards, one request each: their reads run on this many
// threads at once so the device sees a deep queue, as it would for one large sequential read.
constexpr size_t kMaxParallelSources = 16;

}  // namespace

uint64_t BlockWindow::resident_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return resident_bytes_;
}

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
      for (size_t i : mine) to_read.push_back(&wants[i]);
      std::vector<std::shared_ptr<WindowBlock>> read;
      lock.unlock();
      Status status = read_blocks(to_read, deadline, &read, bytes_read);
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
      evict_locked();
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
                                std::vector<std::shared_ptr<WindowBlock>>* read,
                                uint64_t* bytes_read) {
  // One request per block, aligned for O_DIRECT where the source bypasses the page cache (the
  // source reads a file's unaligned tail itself).
  std::vector<ReadRequest> requests(wants.size());
  read->resize(wants.size());
  for (size_t j = 0; j < wants.size(); ++j) {
    const Want& want = *wants[j];
    const bool direct = want.source->bypasses_page_cache();
    const uint64_t begin =
        direct ? internal::align_down(want.offset, kDirectIoAlignment) : want.offset;
    const uint64_t end =
        direct ? std::min(want.source->size(),
                          internal::align_up(want.offset + want.length, kDirectIoAlignment))
               : want.offset + want.length;
    std::shared_ptr<WindowBlock> block = take_spare();
    Status reserved = block->memory.reserve(end - begin, end - begin + (1 << 20), /*pin=*/false);
    if (!reserved.is_ok()) {
      return Status(ErrorCode::kResourceExhausted,
                    reserved.message() + " (block " + std::to_string(want.block) + " of '" +
                        want.source->name() + "')");
    }
    block->offset = begin;
    block->length = end - begin;
    requests[j] = {begin, {block->memory.data(), end - begin}};
    (*read)[j] = std::move(block);
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
  if (threads <= 1) {
    read_groups(0, 1);
  } else {
    std::vector<std::thread> readers;
    for (size_t t = 1; t < threads; ++t) readers.emplace_back(read_groups, t, threads);
    read_groups(0, threads);
    for (std::thread& reader : readers) reader.join();
  }
  for (const Group& group : groups) ZW_RETURN_IF_ERROR(group.status);
  return Status::ok();
}

std::shared_ptr<WindowBlock> BlockWindow::take_spare() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (spare_.empty()) return std::make_shared<WindowBlock>();
  std::shared_ptr<WindowBlock> block = std::move(spare_.back());
  spare_.pop_back();
  return block;
}

void BlockWindow::evict_locked() {
  while (resident_bytes_ > budget_bytes_ && !recent_.empty()) {
    auto it = blocks_.find(recent_.back());
    std::shared_ptr<WindowBlock> block = std::move(it->second.block);
    resident_bytes_ -= block->length;
    blocks_.erase(it);
    recent_.pop_back();
    // In use by a builder: it is freed with its last user instead.
    if (block.use_count() == 1 && (spare_.size() + 1) * block->length <= budget_bytes_ / 4) {
      spare_.push_back(std::move(block));
    }
  }
}

}  // namespace zerowait
