// Helpers shared by the C++ tests: a temporary directory that cleans up, file I/O, seeded random
// bytes, and running the real `zerowait` command as a subprocess.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zerowait::testing {

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

// Creates parent directories as needed; aborts the test (ADD_FAILURE + exception) on error.
void write_file(const std::string& path, const std::string& bytes);
std::string read_file(const std::string& path);
std::vector<std::byte> to_bytes(const std::string& s);
std::string to_string(const std::vector<std::byte>& b);

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

}  // namespace zerowait::testing
