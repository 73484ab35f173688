// The generic syntax of a URL, and the one rule for paths: a URL is never taken for a local
// folder. Where only a local path works (a run directory, a map folder, a cache directory, the
// output of `generate`), "s3://bucket/x" is refused in one line instead of becoming a relative
// folder named "s3:". Which schemes can be opened is the storage registry's business; this
// header only tells a URL from a path.
#pragma once

#include <string_view>

#include "zerowait/common/status.hpp"

namespace zerowait {

// The scheme of "scheme://rest" as written (RFC 3986: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ),
// then "://"), or "" for a plain path. Pure; thread-safe.
std::string_view url_scheme(std::string_view text);

// True when `text` starts with a URL scheme and "://".
bool is_url(std::string_view text);

// ok for a local path; kInvalidArgument with one line when `text` is a URL:
// "<what>: <text> is a URL; <what> must be a local path" and then "(<fix>)" when `fix` is given
// ("pack it locally first", "use --mirror for remote copies"). `what` names the argument as the
// user wrote it: "--out", "map_dir".
Status require_local_path(std::string_view text, std::string_view what, std::string_view fix = {});

}  // namespace zerowait
