#include "testing/checkpoint_state.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>

#include "testing/testing.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait::testing {

TrainingState TrainingState::make(const std::vector<size_t>& sizes) {
  TrainingState s;
  for (size_t i = 0; i < sizes.size(); ++i) {
    s.names.push_back("/model/layer." + std::to_string(i) + ".weight");
    s.values.emplace_back(sizes[i]);
  }
  return s;
}

void TrainingState::fill(size_t tensor, uint64_t version) {
  std::vector<float>& v = values[tensor];
  for (size_t j = 0; j < v.size(); ++j) {
    v[j] = static_cast<float>((version * 2654435761u + tensor * 40503u + j) % 100003) * 0.5f;
  }
}

void TrainingState::fill_all(uint64_t version) {
  for (size_t i = 0; i < values.size(); ++i) fill(i, version);
}

SaveRequest TrainingState::request(uint64_t step) const {
  SaveRequest r;
  r.step = step;
  r.structure_json = "{\"step\": " + std::to_string(step) + "}";
  for (size_t i = 0; i < values.size(); ++i) {
    r.tensors.push_back({names[i],
                         "F32",
                         {static_cast<int64_t>(values[i].size())},
                         4,
                         true,
                         values[i].data(),
                         values[i].size() * sizeof(float)});
  }
  return r;
}

std::vector<std::vector<float>> read_all(Store& target, uint64_t step, uint32_t rank,
                                         RestoreOptions options) {
  auto manifest = read_rank_manifest(target, step, rank);
  EXPECT_TRUE(manifest.is_ok()) << manifest.status().to_string();
  if (!manifest.is_ok()) return {};
  std::vector<std::vector<float>> out;
  Status s = read_every_tensor(target, manifest.value(), &out, options, /*fresh=*/true);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return out;
}

Status read_every_tensor(Store& target, const RankManifest& manifest,
                         std::vector<std::vector<float>>* out, RestoreOptions options, bool fresh) {
  out->clear();
  std::vector<TensorRead> reads;
  for (const StoredTensor& t : manifest.tensors) out->emplace_back(t.nbytes / sizeof(float));
  for (size_t i = 0; i < out->size(); ++i) {
    reads.push_back({i, reinterpret_cast<std::byte*>((*out)[i].data()), fresh});
  }
  return read_tensors(target, manifest, reads, options);
}

Result<RestoredStep> restore_newest_into(Store& primary, Store* mirror,
                                         const RestoreNewestOptions& options,
                                         std::vector<std::vector<float>>* out,
                                         RestoreOptions read) {
  out->clear();
  return restore_newest(primary, mirror, options, [&](const StepCopy& copy) {
    return read_every_tensor(*copy.target, *copy.manifest, out, read);
  });
}

SaveResult save_and_wait(Checkpointer& cp, const SaveRequest& request) {
  auto handle = cp.save(request);
  EXPECT_TRUE(handle.is_ok()) << handle.status().to_string();
  if (!handle.is_ok()) return {};
  auto result = handle.value()->wait();
  EXPECT_TRUE(result.is_ok()) << result.status().to_string();
  return result.is_ok() ? result.value() : SaveResult{};
}

std::unique_ptr<Checkpointer> open_or_die(std::shared_ptr<Store> target,
                                          CheckpointOptions options) {
  auto cp = Checkpointer::open(std::move(target), options);
  EXPECT_TRUE(cp.is_ok()) << cp.status().to_string();
  return std::move(cp).value();
}

void copy_directory_into(const std::string& dir, Store& target) {
  namespace fs = std::filesystem;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(dir)) {
    const std::string rel = fs::relative(entry.path(), dir).string();
    if (entry.is_directory()) {
      ASSERT_TRUE(target.make_directory(rel, metadata_deadline()).is_ok()) << rel;
      continue;
    }
    const std::string bytes = read_file(entry.path().string());
    auto file = target.create(rel, metadata_deadline());
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    ASSERT_TRUE(
        (*file)
            ->write_at(0, std::span(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()),
                       write_deadline())
            .is_ok());
    ASSERT_TRUE((*file)->close(write_deadline()).is_ok());
  }
}

std::shared_ptr<Store> fresh_memory_store(const std::string& name) {
  static std::atomic<int> made{0};
  auto store = open_store("memory://" + name + "-" + std::to_string(++made));
  EXPECT_TRUE(store.is_ok()) << store.status().to_string();
  return store.is_ok() ? *store : nullptr;
}

}  // namespace zerowait::testing
