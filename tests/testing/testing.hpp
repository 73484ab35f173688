// Helpers shared by the C++ tests: a temporary directory that cleans up, file I/O, seeded random
// bytes, and running the real `zerowait` command as a subprocess.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zerowait::testing {

inline constexpr uint64_t kMiB = uint64_t(1) << 20;
inline constexpr uint64_t kGiB = uint64_t(1) << 30;

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // path() + "/" + relative
  std::string operator/(const std::string& relative) const { return path_ + "/" + relative; }

 private:
  std::string path_;
};

// Whether `text` holds `part`, saying what it holds when not (for EXPECT_TRUE).
::testing::AssertionResult contains(const std::string& text, const std::string& part);

// Creates parent directories as needed; aborts the test (ADD_FAILURE + exception) on error.
void write_file(const std::string& path, const std::string& bytes);
std::string read_file(const std::string& path);
// Whether `path` exists within `limit`, looked for every 5 ms: a forked child's go-ahead at a
// moment its parent chooses (after something it waits for has happened).
bool wait_for_file(const std::string& path, std::chrono::milliseconds limit);
std::vector<std::byte> to_bytes(const std::string& s);
std::string to_string(std::span<const std::byte> b);
// The bytes of `s` where they are (valid as long as `s` is).
std::span<const std::byte> as_bytes(std::string_view s);

// `size` bytes from a generator seeded with `seed`: the same seed, the same bytes.
std::string random_bytes(size_t size, uint64_t seed);

// A small valid baseline JPEG (solid colour, encoded with libjpeg-turbo), seeded for variety.
std::string make_jpeg(int width, int height, uint64_t seed);

struct CommandResult {
  int exit_code = -1;  // the exit status, or 128 + signal number
  std::string out;     // stdout
  std::string err;     // stderr
};

// Runs argv (argv[0] is a path) with no stdin; captures stdout and stderr. `extra_env` entries
// ("NAME=value") are added to the environment of the child.
CommandResult run_command(const std::vector<std::string>& argv,
                          const std::vector<std::string>& extra_env = {});
// Runs the zerowait CLI built alongside the tests.
CommandResult run_cli(const std::vector<std::string>& args,
                      const std::vector<std::string>& extra_env = {});

// The user id unprivileged runs take when the tests run as root (CI does): nobody.
inline constexpr unsigned kUnprivilegedId = 65534;
// `argv` run as an unprivileged user: through setpriv as kUnprivilegedId (no groups, no
// capabilities) when this process is root, unchanged otherwise. What it reads must be open to
// that user (a TempDir is 0700: chmod it).
std::vector<std::string> unprivileged(std::vector<std::string> argv);
// The CLI run that way.
CommandResult run_cli_unprivileged(const std::vector<std::string>& args,
                                   const std::vector<std::string>& extra_env = {});
// Runs `body` in a forked child as an unprivileged user (kUnprivilegedId when this process is
// root, this user otherwise) and returns what it returned. "" and a test failure when the child
// fails. The child shares nothing back but that text: no gtest assertions inside `body`.
std::string run_unprivileged(const std::function<std::string()>& body);

}  // namespace zerowait::testing
