// `zerowait unpack DATASET -o DIR`: every sample's fields back out as DIR/<key>.<field> files.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <span>
#include <vector>

#include "commands.hpp"
#include "output.hpp"
#include "progress_bar.hpp"
#include "zerowait/shard/webdataset.hpp"

namespace zerowait::cli {
namespace {

namespace fs = std::filesystem;

struct UnpackArgs {
  std::string path;
  std::string out_dir;
  bool overwrite = false;
};

struct UnpackTotals {
  uint64_t samples = 0;
  uint64_t files = 0;
  uint64_t bytes = 0;
};

// Keys come from the data, not from the user: a crafted tar could name "../../.bashrc". Every
// key is checked before anything is written, so a refused dataset leaves no partial output.
void check_keys(const Dataset& ds) {
  for (size_t s = 0; s < ds.shard_count(); ++s) {
    std::shared_ptr<ShardReader> reader = unwrap(ds.shard(s));
    for (uint64_t i = 0; i < reader->size(); ++i) {
      if (!is_safe_relative_path(reader->key(i))) {
        throw CliError("refusing to unpack sample " + std::to_string(i) + " of '" +
                       ds.shard_path(s) + "': key '" + std::string(reader->key(i)) +
                       "' is not a safe relative path (absolute, empty component or '..')");
      }
    }
  }
}

void write_field_file(const std::string& path, std::span<const std::byte> bytes, bool overwrite) {
  // O_EXCL makes "never overwrite" atomic instead of a check-then-write race.
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (overwrite ? O_TRUNC : O_EXCL);
  const int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) {
    if (errno == EEXIST) {
      throw CliError("'" + path + "' already exists (pass --overwrite to replace it)");
    }
    check(errno_status(errno, "cannot create", path));
  }
  const int write_err = write_all(fd, bytes);
  const int close_err = ::close(fd) == 0 ? 0 : errno;
  if (write_err != 0) check(errno_status(write_err, "cannot write", path));
  if (close_err != 0) check(errno_status(close_err, "cannot close", path));
}

void create_parent_dirs(const fs::path& file, fs::path* last_created) {
  fs::path parent = file.parent_path();
  if (parent == *last_created) return;  // samples of one directory arrive together
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) throw CliError("cannot create directory '" + parent.string() + "': " + ec.message());
  *last_created = parent;
}

UnpackTotals unpack_all(const Dataset& ds, const UnpackArgs& args) {
  UnpackTotals totals;
  ProgressBar progress("unpack", "samples");
  std::vector<std::byte> buffer;
  fs::path last_dir;
  ReadOptions options;
  options.verify = true;  // unpacking corrupt bytes would silently spread the damage
  for (size_t s = 0; s < ds.shard_count(); ++s) {
    std::shared_ptr<ShardReader> reader = unwrap(ds.shard(s));
    for (uint64_t i = 0; i < reader->size(); ++i) {
      buffer.resize(reader->sample_bytes(i));
      const SampleView view = unwrap(reader->read_sample(i, buffer, options));
      for (const FieldView& field : view.fields) {
        const std::string relative = std::string(view.key) + "." + std::string(field.name);
        if (!is_safe_relative_path(relative)) {
          throw CliError("refusing to write field '" + std::string(field.name) + "' of key '" +
                         std::string(view.key) + "': '" + relative +
                         "' is not a safe relative path");
        }
        const fs::path file = fs::path(args.out_dir) / relative;
        create_parent_dirs(file, &last_dir);
        write_field_file(file.string(), field.bytes, args.overwrite);
        totals.files += 1;
        totals.bytes += field.bytes.size();
      }
      totals.samples += 1;
      progress.update(totals.samples, ds.size(), totals.bytes, 0);
    }
  }
  return totals;
}

int run_unpack(const UnpackArgs& args) {
  const auto start = std::chrono::steady_clock::now();
  std::shared_ptr<Dataset> ds = open_dataset(args.path);
  check_keys(*ds);
  const UnpackTotals totals = unpack_all(*ds, args);
  const double seconds = seconds_since(start);
  std::cout << "unpacked " << totals.samples << " samples into " << totals.files << " files ("
            << format_bytes(totals.bytes) << ") under " << args.out_dir << " in "
            << format_duration(seconds) << ", " << format_rate(totals.bytes, seconds) << '\n';
  return kExitOk;
}

}  // namespace

Command add_unpack_command(CLI::App& app) {
  auto args = std::make_shared<UnpackArgs>();
  CLI::App* cmd =
      app.add_subcommand("unpack", "Write every sample's fields back out as KEY.FIELD files");
  add_dataset_argument(cmd, "DATASET", &args->path);
  cmd->add_option("-o,--output", args->out_dir, "Directory to write into (created if missing)")
      ->type_name("DIR")
      ->check(local_path("--output"))
      ->required();
  cmd->add_flag("--overwrite", args->overwrite, "Replace files that already exist");
  cmd->footer(
      "Sample keys that are absolute or contain '..' are refused before anything is written.\n"
      "\n"
      "Example:\n"
      "  zerowait unpack /fast/train -o /tmp/files   # cat/img_001.jpg, cat/img_001.cls, ...");
  return {cmd, [args] { return run_unpack(*args); }};
}

}  // namespace zerowait::cli
