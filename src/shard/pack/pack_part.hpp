// `pack --part I/N`: which samples and tar files of the full input listing part I packs, and the
// fingerprint that lets merge tell the parts of one input from the parts of another.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_set>

#include "shard/pack/pack_plan.hpp"
#include "zerowait/common/status.hpp"
#include "zerowait/shard/pack.hpp"

namespace zerowait::internal {

// ok when 0 <= index < count; kInvalidArgument saying what --part accepts otherwise.
Status check_part(uint32_t index, uint32_t count);

struct PartPlan {
  PackPlan plan;  // the full plan cut down to this part's samples and tar sources
  // Keys of directory samples that earlier parts pack: a later source's duplicate of one is
  // quarantined here, as a single pack would (keys inside tars are not known before streaming).
  std::unordered_set<std::string> earlier_keys;
  std::string input;  // 16 hex digits: see input_fingerprint()
};

// The units of the listing are the samples of directory sources, in plan order, and whole tar
// sources. Each weighs its bytes + 1; a unit goes to the part whose share of the total weight
// holds the unit's first byte, so parts are contiguous, in order, and of about equal bytes.
// `full` must be the plan of the whole input; options.part_index/part_count choose the part.
PartPlan select_part(PackPlan full, const PackOptions& options);

// XXH3 of everything the split and the packed samples depend on: the part count, the options
// that change what is packed (imagefolder, align, verify_images), the class list, and per source
// its kind and listing (directories: every key, field name, size and synthesized value; tars:
// file name and size). Absolute source paths are left out, so machines that mount the input at
// different places agree.
std::string input_fingerprint(const PackPlan& full, const PackOptions& options);

}  // namespace zerowait::internal
