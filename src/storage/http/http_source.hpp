// The http(s) driver's reading side: an object at a URL read in place with ranged GETs, and a
// small object read whole. The registry (storage/open.cpp) routes http:// and https:// here.
#pragma once

#include <memory>
#include <string>

#include "storage/http/http_client.hpp"
#include "storage/ranged_get_source.hpp"
#include "zerowait/common/status.hpp"

namespace zerowait::internal {

// A ByteSource over the object at `url` through `client`: its size and ETag from one HEAD. Each
// read request is one ranged GET with the read's deadline. A server that ignores Range, or
// answers a range with other bytes than asked, is kUnsupported / kCorrupt naming the URL and
// range.
Result<std::unique_ptr<ByteSource>> open_http_source(std::shared_ptr<HttpClient> client,
                                                     const std::string& url, Deadline deadline);

// The same through default_http_client(), without any request when `known` is given.
Result<std::unique_ptr<ByteSource>> open_http_url(const std::string& url, Deadline deadline,
                                                  const KnownObject* known);

// The whole object at `url` with one GET through default_http_client(). kNotFound when there is
// none.
Result<std::string> read_http_object(const std::string& url, Deadline deadline);

}  // namespace zerowait::internal
