#include "zerowait/storage/url.hpp"

#include <string>

#include "common/path_check.hpp"

namespace zerowait {

// The syntax is parsed by internal::url_scheme (common/path_check), which the remote clients in
// io/remote still include; this is its public face until those move under storage/.
std::string_view url_scheme(std::string_view text) { return internal::url_scheme(text); }

bool is_url(std::string_view text) { return !url_scheme(text).empty(); }

Status require_local_path(std::string_view text, std::string_view what, std::string_view fix) {
  if (!is_url(text)) return Status::ok();
  std::string message = std::string(what) + ": " + std::string(text) + " is a URL; " +
                        std::string(what) + " must be a local path";
  if (!fix.empty()) message += " (" + std::string(fix) + ")";
  return invalid_argument(std::move(message));
}

}  // namespace zerowait
