// Helpers shared by the `zerowait` commands: exit codes, turning library errors into the one
// top-level error path, human formatting of sizes/rates/tables, and JSON printing.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.hpp"
#include "common/text.hpp"
#include "zerowait/common/status.hpp"
#include "zerowait/shard/dataset.hpp"

namespace zerowait {
struct ColdCacheMethod;  // zerowait/diagnose/cold_cache.hpp
}  // namespace zerowait

namespace zerowait::cli {

using internal::seconds_since;

// Exit codes, documented in `zerowait --help`.
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;     // the command line could not be parsed
inline constexpr int kExitProblems = 3;  // the command completed but found bad inputs/samples

// Thrown by commands for a failure that ends the command; main() prints
// "zerowait: error: <what>" and exits with kExitError.
class CliError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws CliError carrying the status message when `status` is an error.
void check(const Status& status);

// Returns the value of `result`, or throws CliError with its message.
template <typename T>
T unwrap(Result<T> result) {
  check(result.status());
  return std::move(result).value();
}

// --no-cache (add_dataset_argument adds it): read a remote dataset without the node-local cache.
bool& no_cache_flag();
// How a command opens the dataset at `path`: a remote one through the node's default cache
// (open_default_block_cache), unless --no-cache. Throws CliError.
DatasetOptions dataset_options(const std::string& path);
// Opens a dataset (manifest, directory, .zws or .tar) with dataset_options(), or throws CliError.
std::shared_ptr<Dataset> open_dataset(const std::string& path);

// Writes all of `bytes` to `fd`, retrying short writes and EINTR. Returns 0, or the errno of the
// write that failed (callers decide: EPIPE on stdout is not an error for `cat`).
int write_all(int fd, std::span<const std::byte> bytes);

using internal::format_bytes;  // "57.0 MiB" (common/text.hpp)
using internal::format_fixed;  // "12.35" (common/text.hpp)
// Decimal megabytes per second ("123.4 MB/s"); "-" when no time has passed.
std::string format_rate(uint64_t bytes, double seconds);
// "0.42 s", "12.3 s", "3:07", "1:02:03".
std::string format_duration(double seconds);
// Joins `items` with ", ", listing at most `max_items` and then "... (N more)".
std::string join_limited(const std::vector<std::string>& items, size_t max_items);

// "1 shard", "15 shards".
std::string count_noun(uint64_t count, const std::string& singular, const std::string& plural);

enum class Align { kLeft, kRight };

// A plain-text table: every column padded to its widest cell (header included).
class Table {
 public:
  struct Column {
    std::string title;
    Align align = Align::kLeft;
  };
  explicit Table(std::vector<Column> columns);
  // `row` has one cell per column.
  void add_row(std::vector<std::string> row);
  void print(std::ostream& out) const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

// Prints "label:  value" lines with the values lined up.
void print_key_values(std::ostream& out,
                      const std::vector<std::pair<std::string, std::string>>& lines);

// Prints `value` to stdout, indented, with a trailing newline.
void print_json(const nlohmann::ordered_json& value);

// How a bench kept the page cache out of its cold numbers: the "cold_cache" object of its
// --json ({"method", "needs_root": false, "what", "stays_warm"}) and the lines of its table.
nlohmann::ordered_json cold_cache_json(const ColdCacheMethod& method);
void print_cold_cache(std::ostream& out, const ColdCacheMethod& method);

}  // namespace zerowait::cli
