// One-time notes (common/log: note_fallback) are printed once per process tree, not once per
// process: of several processes forked from one that meet the same fallback (the ranks of a job,
// a loader's workers) exactly one prints it, a program exec'd below one that printed it stays
// quiet, and every process still counts each occurrence for its stats.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "testing/child_processes.hpp"
#include "testing/testing.hpp"

namespace zerowait {
namespace {

using internal::fallback_count;
using internal::note_fallback;

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(FallbackNotes, OfProcessesForkedFromOneExactlyOnePrintsTheNote) {
  testing::TempDir dir;
  // A kind of this run's own: the tree this test process heads remembers kinds across repeats.
  static int run = 0;
  const std::string kind = "test_forked_siblings_" + std::to_string(++run);
  testing::ChildProcesses children;
  std::vector<pid_t> pids;
  for (int c = 0; c < 4; ++c) {
    const std::string err = dir / ("stderr-" + std::to_string(c));
    pids.push_back(children.add([err, kind] {
      if (std::freopen(err.c_str(), "w", stderr) == nullptr) return 2;
      note_fallback(kind, "a fallback every rank meets");
      note_fallback(kind, "a fallback every rank meets");
      std::fflush(stderr);
      return fallback_count(kind) == 2 ? 0 : 1;  // each still counts
    }));
  }
  children.start();  // all four at once
  for (pid_t pid : pids) EXPECT_EQ(children.wait(pid), 0);
  size_t printed = 0;
  for (int c = 0; c < 4; ++c) {
    printed += occurrences(testing::read_file(dir / ("stderr-" + std::to_string(c))),
                           "zerowait: note: a fallback every rank meets");
  }
  EXPECT_EQ(printed, 1u);
}

// Run as its own program by the test below (with ZW_TEST_NOTE_HELPER set); skips otherwise.
TEST(FallbackNotes, HelperNotingTwoKinds) {
  if (std::getenv("ZW_TEST_NOTE_HELPER") == nullptr) GTEST_SKIP() << "run by the test below";
  note_fallback("test_noted_above", "noted already by the program above");
  note_fallback("test_new_here", "new in this program");
  EXPECT_EQ(fallback_count("test_noted_above"), 1u);
}

TEST(FallbackNotes, AProgramExecdBelowOneThatPrintedANoteDoesNotPrintItAgain) {
  note_fallback("test_noted_above", "noted already by the program above");
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const testing::CommandResult helper = testing::run_command(
      {self, "--gtest_filter=FallbackNotes.HelperNotingTwoKinds"}, {"ZW_TEST_NOTE_HELPER=1"});
  ASSERT_EQ(helper.exit_code, 0) << helper.out << helper.err;
  EXPECT_NE(helper.out.find("[  PASSED  ] 1 test"), std::string::npos) << helper.out;
  EXPECT_EQ(occurrences(helper.err, "noted already by the program above"), 0u) << helper.err;
  EXPECT_EQ(occurrences(helper.err, "zerowait: note: new in this program"), 1u) << helper.err;
}

}  // namespace
}  // namespace zerowait
