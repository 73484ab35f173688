#include "testing/image_dataset.hpp"

#include <gtest/gtest.h>

#include <stdexcept>

#include "zerowait/shard/pack.hpp"
#include "zerowait/shard/synthetic.hpp"

namespace zerowait::testing {

uint64_t pack_image_dataset(const std::string& work_dir, const std::string& out_dir,
                            const ImageDatasetOptions& options) {
  SyntheticImageFolderOptions images;
  images.out_dir = work_dir + "/images";
  images.files = options.files;
  images.classes = options.classes;
  images.min_bytes = options.min_bytes;
  images.max_bytes = options.max_bytes;
  images.threads = 1;
  auto generated = generate_imagefolder(images);
  if (!generated.is_ok()) {
    ADD_FAILURE() << generated.status().to_string();
    throw std::runtime_error(generated.status().to_string());
  }
  PackOptions pack_options;
  pack_options.sources = {images.out_dir};
  pack_options.out_dir = out_dir;
  pack_options.imagefolder = true;
  pack_options.shard_size = options.shard_size;
  pack_options.sync = false;
  pack_options.threads = 1;
  auto report = pack(pack_options);
  if (!report.is_ok()) {
    ADD_FAILURE() << report.status().to_string();
    throw std::runtime_error(report.status().to_string());
  }
  return report->shards;
}

}  // namespace zerowait::testing
