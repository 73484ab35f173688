#include "zerowait/storage/url.hpp"

#include <cctype>
#include <string>

#include "storage/local_path.hpp"

namespace zerowait {

std::string_view url_scheme(std::string_view text) {
  const size_t colon = text.find("://");
  if (colon == std::string_view::npos || colon == 0) return {};
  const std::string_view scheme = text.substr(0, colon);
  if (std::isalpha(static_cast<unsigned char>(scheme[0])) == 0) return {};
  for (char c : scheme) {
    if (std::isalnum(static_cast<unsigned char>(c)) == 0 && c != '+' && c != '-' && c != '.') {
      return {};
    }
  }
  return scheme;
}

bool is_url(std::string_view text) { return !url_scheme(text).empty(); }

Status require_local_path(std::string_view text, std::string_view what, std::string_view fix) {
  if (!is_url(text)) return Status::ok();
  std::string message = std::string(what) + ": " + std::string(text) + " is a URL; " +
                        std::string(what) + " must be a local path";
  if (!fix.empty()) message += " (" + std::string(fix) + ")";
  return invalid_argument(std::move(message));
}

namespace internal {

Status require_local_path(const std::filesystem::path& path, std::string_view what) {
  const std::string text = path.string();
  const std::string_view scheme = url_scheme(text);
  if (scheme.empty()) return Status::ok();
  std::string message = std::string(what) + " '" + text + "' is a URL (" + std::string(scheme) +
                        "://), and remote storage is not supported yet: ";
  if (scheme == "file") {
    message += "give the local path without file://";
  } else {
    message += "give a local directory (or a mounted filesystem's path)";
  }
  return invalid_argument(std::move(message));
}

}  // namespace internal
}  // namespace zerowait
