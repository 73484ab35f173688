#include "loader/batch.hpp"

#include <algorithm>
#include <cstring>
#include <new>

namespace zerowait {

namespace {

// The alignment BatchColumn promises, for copies as for the arena's columns.
constexpr std::align_val_t kCopyAlignment{64};

std::shared_ptr<std::byte[]> aligned_copy(const std::byte* data, uint64_t bytes) {
  // At least one byte, so an empty column still has a valid, unique address.
  auto* memory =
      static_cast<std::byte*>(::operator new[](std::max<uint64_t>(bytes, 1), kCopyAlignment));
  if (bytes > 0) std::memcpy(memory, data, bytes);
  return std::shared_ptr<std::byte[]>(memory,
                                      [](std::byte* p) { ::operator delete[](p, kCopyAlignment); });
}

}  // namespace

Batch::Impl::Impl(std::shared_ptr<ArenaPool> pool_, Arena* arena_)
    : pool(std::move(pool_)), arena(arena_) {}

Batch::Impl::~Impl() {
  if (arena != nullptr) pool->release(arena);
}

Batch::Batch(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  impl_->views.assign(impl_->columns.size(), 0);
}
Batch::~Batch() = default;

uint64_t Batch::epoch() const { return impl_->epoch; }
uint64_t Batch::number() const { return impl_->number; }
uint64_t Batch::samples() const { return impl_->samples; }
const std::vector<BatchColumn>& Batch::columns() const { return impl_->columns; }
const std::vector<std::string>& Batch::keys() const { return impl_->keys; }
bool Batch::pinned() const { return impl_->arena != nullptr && impl_->arena->out.pinned(); }

const BatchColumn* Batch::column(const std::string& name) const {
  for (const BatchColumn& c : impl_->columns) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

std::shared_ptr<const BatchColumn> Batch::view(std::shared_ptr<const Batch> batch, size_t index) {
  Impl& impl = *batch->impl_;
  {
    std::lock_guard<std::mutex> lock(impl.pool->mutex());
    ++impl.views[index];
  }
  const BatchColumn* column = &impl.columns[index];
  // The deleter owns the batch reference: the arena stays out of the pool while the view lives.
  return std::shared_ptr<const BatchColumn>(column,
                                            [batch = std::move(batch), index](const BatchColumn*) {
                                              Impl& impl = *batch->impl_;
                                              std::lock_guard<std::mutex> lock(impl.pool->mutex());
                                              --impl.views[index];
                                            });
}

void copy_small_columns(const std::vector<bool>& always, Batch::Impl* batch) {
  for (size_t c = 0; c < batch->columns.size(); ++c) {
    BatchColumn& column = batch->columns[c];
    if (!always[c] && column.bytes >= kOwnedColumnMaxBytes) continue;
    column.copy = aligned_copy(column.data, column.bytes);
    column.data = column.copy.get();
  }
}

std::string held_batches_locked(const ArenaPool& pool) {
  // A few examples say enough; a pool may have dozens of arenas.
  constexpr size_t kShown = 8;
  std::string report;
  size_t held = 0;
  for (const std::unique_ptr<Arena>& arena : pool.arenas()) {
    const Batch::Impl* batch = arena->holder;
    if (batch == nullptr) continue;
    if (++held > kShown) continue;
    std::string columns;
    for (size_t c = 0; c < batch->columns.size(); ++c) {
      if (batch->views[c] == 0) continue;
      columns += (columns.empty() ? "'" : ", '") + batch->columns[c].name + "'";
    }
    report += (report.empty() ? "" : "; ") + std::string("batch ") + std::to_string(batch->number) +
              " of epoch " + std::to_string(batch->epoch) +
              (columns.empty() ? " (the Batch itself)" : " (columns " + columns + ")");
  }
  if (held > kShown) report += "; and " + std::to_string(held - kShown) + " more";
  return report;
}

}  // namespace zerowait
