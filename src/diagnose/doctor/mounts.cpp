#include "diagnose/doctor/mounts.hpp"

#include <algorithm>
#include <cstdio>
#include <iterator>

namespace zerowait::doctor {
namespace {

// mountinfo writes a space, tab, newline and backslash in a path as \040, \011, \012, \134.
std::string decode_octal_escapes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto is_octal = [&](size_t at) { return text[at] >= '0' && text[at] <= '7'; };
    if (text[i] == '\\' && i + 3 < text.size() && is_octal(i + 1) && is_octal(i + 2) &&
        is_octal(i + 3)) {
      out += char((text[i + 1] - '0') * 64 + (text[i + 2] - '0') * 8 + (text[i + 3] - '0'));
      i += 3;
    } else {
      out += text[i];
    }
  }
  return out;
}

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(separator, start), text.size());
    if (end > start) parts.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

// The value of `name` in a comma-separated option list: "" for a bare flag, nullopt if absent.
std::optional<std::string> find_in_options(std::string_view options, std::string_view name) {
  for (std::string_view option : split(options, ',')) {
    if (option == name) return std::string();
    if (option.size() > name.size() && option.substr(0, name.size()) == name &&
        option[name.size()] == '=') {
      return std::string(option.substr(name.size() + 1));
    }
  }
  return std::nullopt;
}

std::optional<Mount> parse_line(std::string_view line) {
  const std::vector<std::string_view> fields = split(line, ' ');
  size_t separator = 6;  // optional fields ("shared:1") end at a lone "-"
  while (separator < fields.size() && fields[separator] != "-") ++separator;
  if (fields.size() < 6 || separator + 2 >= fields.size()) return std::nullopt;
  Mount mount;
  if (std::sscanf(std::string(fields[2]).c_str(), "%u:%u", &mount.major, &mount.minor) != 2) {
    return std::nullopt;
  }
  mount.root = decode_octal_escapes(fields[3]);
  mount.mount_point = decode_octal_escapes(fields[4]);
  mount.mount_options = std::string(fields[5]);
  mount.fstype = std::string(fields[separator + 1]);
  mount.source = decode_octal_escapes(fields[separator + 2]);
  if (separator + 3 < fields.size()) mount.super_options = std::string(fields[separator + 3]);
  return mount;
}

}  // namespace

std::string Mount::device() const {
  return std::to_string(major) + ":" + std::to_string(minor);
}

bool Mount::has_option(std::string_view name) const {
  return find_in_options(super_options, name) || find_in_options(mount_options, name);
}

std::optional<std::string> Mount::option(std::string_view name) const {
  std::optional<std::string> value = find_in_options(super_options, name);
  if (!value) value = find_in_options(mount_options, name);
  if (value && value->empty()) return std::nullopt;  // a bare flag has no value
  return value;
}

std::vector<Mount> parse_mountinfo(std::string_view mountinfo) {
  std::vector<Mount> mounts;
  for (std::string_view line : split(mountinfo, '\n')) {
    if (std::optional<Mount> mount = parse_line(line)) mounts.push_back(std::move(*mount));
  }
  return mounts;
}

const Mount* find_mount(const std::vector<Mount>& mounts, const std::string& path) {
  const Mount* best = nullptr;
  for (const Mount& mount : mounts) {
    const std::string& point = mount.mount_point;
    const bool holds = path.compare(0, point.size(), point) == 0 &&
                       (path.size() == point.size() || point.back() == '/' ||
                        path[point.size()] == '/');
    if (holds && (best == nullptr || point.size() >= best->mount_point.size())) best = &mount;
  }
  return best;
}

std::string bracketed_choice(const std::string& choices) {
  const size_t open = choices.find('[');
  const size_t close = choices.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return choices;
  return choices.substr(open + 1, close - open - 1);
}

std::string format_percent(double share) {
  return format_fixed(share * 100, share < 0.1 ? 1 : 0);
}

}  // namespace zerowait::doctor
