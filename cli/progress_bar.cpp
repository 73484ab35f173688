#include "progress_bar.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "output.hpp"

namespace zerowait::cli {
namespace {

constexpr auto kRedrawInterval = std::chrono::milliseconds(100);
constexpr size_t kBarWidth = 12;

size_t terminal_columns() {
  winsize size{};
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}

// Writes straight to fd 2: stderr may be shared with the library's worker threads, and one
// write() per frame keeps a frame from being interleaved with other output.
void write_stderr(const std::string& text) {
  (void)write_all(STDERR_FILENO, std::as_bytes(std::span(text)));
}

}  // namespace

ProgressBar::ProgressBar(std::string label, std::string item_unit)
    : label_(std::move(label)),
      item_unit_(std::move(item_unit)),
      enabled_(isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(uint64_t items_done, uint64_t items_total, uint64_t bytes_done,
                         uint64_t bytes_total) {
  if (!enabled_) return;
  std::lock_guard lock(mutex_);
  if (finished_) return;
  // Callbacks from several threads may arrive out of order; progress never goes backwards.
  items_done_ = std::max(items_done_, items_done);
  bytes_done_ = std::max(bytes_done_, bytes_done);
  items_total_ = items_total;
  bytes_total_ = bytes_total;
  auto now = std::chrono::steady_clock::now();
  if (drawn_ && now - last_draw_ < kRedrawInterval) return;
  last_draw_ = now;
  drawn_ = true;
  std::string line = render(internal::seconds(now - start_));
  // Stay one column short of the edge: a full-width line makes some terminals wrap.
  line.resize(std::min(line.size(), terminal_columns() - 1));
  write_stderr("\r" + line + "\033[K");
}

void ProgressBar::finish() {
  if (!enabled_) return;
  std::lock_guard lock(mutex_);
  if (finished_) return;
  finished_ = true;
  if (drawn_) write_stderr("\r\033[K");
}

std::string ProgressBar::render(double seconds) const {
  // The fraction follows bytes when their total is known (sizes vary, so bytes predict better).
  double fraction = -1;
  if (bytes_total_ > 0) {
    fraction = static_cast<double>(bytes_done_) / static_cast<double>(bytes_total_);
  } else if (items_total_ > 0) {
    fraction = static_cast<double>(items_done_) / static_cast<double>(items_total_);
  }
  fraction = std::min(fraction, 1.0);

  std::string line = label_;
  if (fraction >= 0) {
    auto filled = static_cast<size_t>(fraction * kBarWidth);
    char percent[16];
    std::snprintf(percent, sizeof percent, " %3d%% ", static_cast<int>(fraction * 100));
    line += " [" + std::string(filled, '#') + std::string(kBarWidth - filled, '.') + "]" + percent;
  } else {
    line += " ";
  }
  // Most useful first: a narrow terminal cuts the end of the line.
  if (!item_unit_.empty()) {
    line += " " + std::to_string(items_done_);
    if (items_total_ > 0) line += "/" + std::to_string(items_total_);
    line += " " + item_unit_;
  } else {
    line += " " + format_bytes(bytes_done_);
    if (bytes_total_ > 0) line += " / " + format_bytes(bytes_total_);
  }
  if (fraction > 0 && fraction < 1) {
    line += "  ETA " + format_duration(seconds / fraction - seconds);
  }
  if (bytes_done_ > 0) line += "  " + format_rate(bytes_done_, seconds);
  if (!item_unit_.empty() && seconds > 0) {
    char rate[32];
    std::snprintf(rate, sizeof rate, "  %.0f %s/s", static_cast<double>(items_done_) / seconds,
                  item_unit_.c_str());
    line += rate;
  }
  return line;
}

}  // namespace zerowait::cli
