#include "output.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <iostream>
#include <iterator>

#include "common/text.hpp"
#include "zerowait/diagnose/cold_cache.hpp"
#include "zerowait/storage/cache_directory.hpp"

namespace zerowait::cli {

void check(const Status& status) {
  if (!status.is_ok()) throw CliError(status.message());
}

bool& no_cache_flag() {
  static bool no_cache = false;  // one command runs per process
  return no_cache;
}

DatasetOptions dataset_options(const std::string& path) {
  DatasetOptions options;
  if (!no_cache_flag()) options.cache = unwrap(open_default_block_cache(path));
  return options;
}

std::shared_ptr<Dataset> open_dataset(const std::string& path) {
  return unwrap(Dataset::open(path, dataset_options(path)));
}

int write_all(int fd, std::span<const std::byte> bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    done += static_cast<size_t>(n);
  }
  return 0;
}

using internal::printf_string;

std::string format_rate(uint64_t bytes, double seconds) {
  if (seconds <= 0) return "-";
  return printf_string("%.1f MB/s", static_cast<double>(bytes) / 1e6 / seconds);
}

std::string format_duration(double seconds) {
  if (seconds < 10) return printf_string("%.2f s", seconds);
  if (seconds < 60) return printf_string("%.1f s", seconds);
  auto total = static_cast<uint64_t>(seconds + 0.5);
  char buf[64];
  if (total < 3600) {
    std::snprintf(buf, sizeof buf, "%u:%02u", static_cast<unsigned>(total / 60),
                  static_cast<unsigned>(total % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%llu:%02u:%02u", static_cast<unsigned long long>(total / 3600),
                  static_cast<unsigned>(total / 60 % 60), static_cast<unsigned>(total % 60));
  }
  return buf;
}

std::string join_limited(const std::vector<std::string>& items, size_t max_items) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < max_items; ++i) {
    if (i > 0) out += ", ";
    out += items[i];
  }
  if (items.size() > max_items) {
    out += ", ... (" + std::to_string(items.size() - max_items) + " more)";
  }
  return out;
}

std::string count_noun(uint64_t count, const std::string& singular, const std::string& plural) {
  return std::to_string(count) + " " + (count == 1 ? singular : plural);
}

Table::Table(std::vector<Column> columns) : columns_(std::move(columns)) {}

void Table::add_row(std::vector<std::string> row) {
  row.resize(columns_.size());
  rows_.push_back(std::move(row));
}

void Table::print(std::ostream& out) const {
  std::vector<size_t> widths;
  for (const Column& column : columns_) widths.push_back(column.title.size());
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  auto print_row = [&](const auto& cell_of) {
    std::string line;
    for (size_t c = 0; c < columns_.size(); ++c) {
      const std::string& cell = cell_of(c);
      std::string pad(widths[c] - cell.size(), ' ');
      if (c > 0) line += "  ";
      if (columns_[c].align == Align::kRight) {
        line += pad + cell;
      } else {
        line += c + 1 == columns_.size() ? cell : cell + pad;  // no trailing blanks
      }
    }
    out << line << '\n';
  };
  print_row([&](size_t c) -> const std::string& { return columns_[c].title; });
  for (const auto& row : rows_) print_row([&](size_t c) -> const std::string& { return row[c]; });
}

void print_key_values(std::ostream& out,
                      const std::vector<std::pair<std::string, std::string>>& lines) {
  size_t width = 0;
  for (const auto& [label, value] : lines) width = std::max(width, label.size());
  for (const auto& [label, value] : lines) {
    out << label << ':' << std::string(width - label.size() + 2, ' ') << value << '\n';
  }
}

void print_json(const nlohmann::ordered_json& value) {
  // Replace invalid UTF-8 (keys come from file names) instead of throwing mid-output.
  std::cout << value.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << '\n';
}

nlohmann::ordered_json cold_cache_json(const ColdCacheMethod& method) {
  return {{"method", method.method},
          {"needs_root", false},
          {"what", method.what},
          {"stays_warm", method.stays_warm}};
}

void print_cold_cache(std::ostream& out, const ColdCacheMethod& method) {
  out << "cold cache: " << method.method << ", no root needed: " << method.what << ".\n"
      << "  not evicted: " << method.stays_warm << ".\n";
}

}  // namespace zerowait::cli
