// A one-line progress display on stderr for long commands (pack, verify, unpack, generate).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace zerowait::cli {

// Draws only when stderr is a terminal, so pipes, logs and tests see nothing. Shows the
// percentage, counts, items/s, MB/s and an ETA; redraws at most 10 times a second; the line is
// cleared by finish() (or the destructor) so the command's own output starts on a clean line.
// update() is thread-safe: library callbacks may come from worker threads.
class ProgressBar {
 public:
  // `label` leads the line ("pack"); `item_unit` names the counted items ("files"), or is empty
  // when only bytes are counted.
  ProgressBar(std::string label, std::string item_unit);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Reports cumulative progress. A total of 0 means unknown; the percentage and ETA follow the
  // bytes when their total is known, the items otherwise.
  void update(uint64_t items_done, uint64_t items_total, uint64_t bytes_done, uint64_t bytes_total);
  // Clears the line; later updates are ignored.
  void finish();

 private:
  std::string render(double seconds) const;

  const std::string label_;
  const std::string item_unit_;
  const bool enabled_;
  const std::chrono::steady_clock::time_point start_;
  std::mutex mutex_;
  std::chrono::steady_clock::time_point last_draw_{};
  bool drawn_ = false;
  bool finished_ = false;
  uint64_t items_done_ = 0;
  uint64_t items_total_ = 0;
  uint64_t bytes_done_ = 0;
  uint64_t bytes_total_ = 0;
};

}  // namespace zerowait::cli
