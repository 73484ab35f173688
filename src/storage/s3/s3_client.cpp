#include "storage/s3/s3_client.hpp"

#include <expat.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <utility>

#include "zerowait/storage/url.hpp"
#include "common/text.hpp"
#include "storage/s3/sigv4.hpp"

namespace zerowait::internal {
namespace {

// Leaf elements of an XML document in order, as ("Parent/Child", text): all zerowait reads of
// S3's answers (errors, listings, upload ids). Parsed with expat, which also decodes entities.
struct XmlLeaves {
  std::vector<std::pair<std::string, std::string>> leaves;
  std::vector<std::string> stack;
  std::string text;
  bool ok = true;

  static Result<XmlLeaves> parse(std::string_view xml, const std::string& what) {
    XmlLeaves out;
    XML_Parser parser = XML_ParserCreate(nullptr);
    XML_SetUserData(parser, &out);
    XML_SetElementHandler(
        parser,
        [](void* self, const XML_Char* name, const XML_Char**) {
          auto* x = static_cast<XmlLeaves*>(self);
          x->stack.emplace_back(name);
          x->text.clear();
        },
        [](void* self, const XML_Char*) {
          auto* x = static_cast<XmlLeaves*>(self);
          std::string path;
          for (const std::string& s : x->stack) path += (path.empty() ? "" : "/") + s;
          x->leaves.emplace_back(std::move(path), std::move(x->text));
          x->text.clear();
          x->stack.pop_back();
        });
    XML_SetCharacterDataHandler(parser, [](void* self, const XML_Char* s, int len) {
      static_cast<XmlLeaves*>(self)->text.append(s, static_cast<size_t>(len));
    });
    const bool parsed =
        XML_Parse(parser, xml.data(), static_cast<int>(xml.size()), 1) != XML_STATUS_ERROR;
    const std::string error = parsed ? "" : XML_ErrorString(XML_GetErrorCode(parser));
    XML_ParserFree(parser);
    if (!parsed) return corrupt(what + ": the answer is not XML (" + error + ")");
    return out;
  }

  // The text of the first leaf whose path ends with `suffix`; "" when there is none.
  std::string first(std::string_view suffix) const {
    for (const auto& [path, text] : leaves) {
      if (path.ends_with(suffix)) return text;
    }
    return "";
  }
};

std::string host_of(const std::string& endpoint) {
  const size_t start = endpoint.find("://") + 3;
  return endpoint.substr(start, endpoint.find('/', start) - start);
}

std::string scheme_of(const std::string& endpoint) {
  return endpoint.substr(0, endpoint.find("://") + 3);
}

// An S3 error answer's code and message, from its XML body (a HEAD has none).
struct S3Error {
  std::string code, message;
  // "SlowDown (Please reduce your request rate.)", or "" when the body said nothing.
  std::string words() const { return code + (message.empty() ? "" : " (" + message + ")"); }
};

S3Error s3_error_of(const HttpResponse& response) {
  S3Error error;
  if (response.body.empty()) return error;
  if (auto xml = XmlLeaves::parse(response.body, "error"); xml.is_ok()) {
    error.code = xml->first("Error/Code");
    error.message = xml->first("Error/Message");
  }
  return error;
}

// S3 answers CompleteMultipartUpload and CopyObject with 200 before the work is done, and when
// it then fails the error is in the body.
Status error_in_body(const HttpResponse& response, const std::string& what) {
  if (response.body.find("<Error>") == std::string::npos) return Status::ok();
  const S3Error error = s3_error_of(response);
  return io_error(what + ": " + (error.code.empty() ? std::string("an error") : error.words()));
}

}  // namespace

Result<S3Location> parse_s3_url(std::string_view url) {
  if (ascii_lower(url_scheme(url)) != "s3") {
    return invalid_argument("'" + std::string(url) + "' is not an s3:// URL");
  }
  const std::string_view rest = url.substr(5);
  const size_t slash = rest.find('/');
  S3Location location{std::string(rest.substr(0, slash)),
                      slash == std::string_view::npos ? "" : std::string(rest.substr(slash + 1))};
  if (location.bucket.empty()) {
    return invalid_argument("'" + std::string(url) + "' names no bucket (s3://BUCKET/KEY)");
  }
  return location;
}

// One S3 request before signing.
struct S3Client::Call {
  std::string operation{};  // for errors: "GET", "PUT part 3", ...
  std::string method{};
  std::string bucket{};
  std::string key{};
  std::string query{};  // encoded, without '?'
  std::vector<std::pair<std::string, std::string>> headers{};
  std::string_view body{};
  std::span<std::byte> into{};
};

S3Client::S3Client(S3Config config, std::shared_ptr<HttpClient> http)
    : config_(std::move(config)), http_(std::move(http)) {}

Result<HttpResponse> S3Client::send(const Call& call, Deadline deadline) {
  const bool virtual_host = config_.addressing == S3Addressing::kVirtualHost;
  const std::string host =
      virtual_host ? call.bucket + "." + host_of(config_.endpoint) : host_of(config_.endpoint);
  std::string path = virtual_host ? "" : "/" + call.bucket;
  path += "/" + sigv4::uri_encode(call.key, /*keep_slash=*/true);
  if (virtual_host && call.key.empty()) path = "/";

  sigv4::Request signing;
  signing.method = call.method;
  signing.path = path;
  signing.query = call.query;
  signing.payload_sha256 = sigv4::sha256_hex(call.body);
  const sigv4::Scope scope{sigv4::amz_date(std::chrono::system_clock::now()), config_.region, "s3"};
  signing.headers = {{"Host", host},
                     {"x-amz-date", scope.date_time},
                     {"x-amz-content-sha256", signing.payload_sha256}};
  if (!config_.credentials.session_token.empty()) {
    signing.headers.emplace_back("x-amz-security-token", config_.credentials.session_token);
  }
  for (const auto& header : call.headers) signing.headers.push_back(header);

  HttpRequest request;
  request.method = call.method;
  request.url =
      scheme_of(config_.endpoint) + host + path + (call.query.empty() ? "" : "?" + call.query);
  request.headers = signing.headers;
  request.headers.emplace_back("Authorization", sigv4::authorization(signing, config_.credentials,
                                                                     scope, sigv4::PathRule::kS3));
  request.body = call.body;
  request.into = call.into;
  request.name = call.operation + " s3://" + call.bucket + "/" + call.key;
  request.describe = [](const HttpResponse& answer) { return s3_error_of(answer).words(); };
  ZW_ASSIGN_OR_RETURN(HttpResponse response, http_->send(request, deadline));
  if (response.status < 300) return response;

  const S3Error error = s3_error_of(response);
  const std::string& code = error.code;
  std::string range;
  for (const auto& [name, value] : call.headers) {
    if (name == "Range") range = " (" + value + ")";
  }
  const std::string what = request.name + range + ": HTTP " + std::to_string(response.status) +
                           (error.words().empty() ? "" : " " + error.words());
  if (response.status == 404 || code == "NoSuchKey" || code == "NoSuchBucket") {
    return not_found(what);
  }
  if (code == "BucketAlreadyOwnedByYou" || code == "BucketAlreadyExists") {
    return Status(ErrorCode::kAlreadyExists, what);
  }
  return io_error(what);
}

Result<S3Object> S3Client::head(const std::string& bucket, const std::string& key,
                                Deadline deadline) {
  ZW_ASSIGN_OR_RETURN(
      HttpResponse response,
      send({.operation = "HEAD", .method = "HEAD", .bucket = bucket, .key = key}, deadline));
  const std::string length = response.header("content-length");
  if (length.empty() || length.find_first_not_of("0123456789") != std::string::npos) {
    return corrupt("HEAD s3://" + bucket + "/" + key + ": no Content-Length in the answer");
  }
  return S3Object{key, std::stoull(length), response.header("etag")};
}

Status S3Client::get_range(const std::string& bucket, const std::string& key, uint64_t offset,
                           std::span<std::byte> into, Deadline deadline) {
  if (into.empty()) return Status::ok();
  const std::string range =
      "bytes=" + std::to_string(offset) + "-" + std::to_string(offset + into.size() - 1);
  ZW_ASSIGN_OR_RETURN(HttpResponse response, send({.operation = "GET",
                                                   .method = "GET",
                                                   .bucket = bucket,
                                                   .key = key,
                                                   .headers = {{"Range", range}},
                                                   .into = into},
                                                  deadline));
  if (response.body_bytes != into.size()) {
    return corrupt("GET s3://" + bucket + "/" + key + " (" + range + ") returned " +
                   std::to_string(response.body_bytes) + " bytes instead of " +
                   std::to_string(into.size()) + " (the object ends sooner?)");
  }
  return Status::ok();
}

Result<std::string> S3Client::get(const std::string& bucket, const std::string& key,
                                  Deadline deadline) {
  ZW_ASSIGN_OR_RETURN(
      HttpResponse response,
      send({.operation = "GET", .method = "GET", .bucket = bucket, .key = key}, deadline));
  return std::move(response.body);
}

Status S3Client::put(const std::string& bucket, const std::string& key, std::string_view body,
                     Deadline deadline) {
  return send({.operation = "PUT", .method = "PUT", .bucket = bucket, .key = key, .body = body},
              deadline)
      .status();
}

Status S3Client::copy(const std::string& bucket, const std::string& from_key,
                      const std::string& to_key, Deadline deadline) {
  const std::string what = "CopyObject s3://" + bucket + "/" + from_key + " to " + to_key;
  ZW_ASSIGN_OR_RETURN(
      HttpResponse response,
      send({.operation = "CopyObject",
            .method = "PUT",
            .bucket = bucket,
            .key = to_key,
            .headers = {{"x-amz-copy-source",
                         "/" + bucket + "/" + sigv4::uri_encode(from_key, /*keep_slash=*/true)}}},
           deadline));
  return error_in_body(response, what);
}

Status S3Client::remove(const std::string& bucket, const std::string& key, Deadline deadline) {
  return send({.operation = "DELETE", .method = "DELETE", .bucket = bucket, .key = key}, deadline)
      .status();
}

Status S3Client::create_bucket(const std::string& bucket, Deadline deadline) {
  return send({.operation = "CreateBucket", .method = "PUT", .bucket = bucket}, deadline).status();
}

Result<std::vector<S3Object>> S3Client::list(const std::string& bucket, const std::string& prefix,
                                             Deadline deadline, uint32_t page_size) {
  std::vector<S3Object> objects;
  std::string token;
  for (;;) {
    std::string query = "list-type=2&max-keys=" + std::to_string(std::clamp(page_size, 1u, 1000u));
    if (!prefix.empty()) query += "&prefix=" + sigv4::uri_encode(prefix, false);
    if (!token.empty()) query += "&continuation-token=" + sigv4::uri_encode(token, false);
    ZW_ASSIGN_OR_RETURN(
        HttpResponse response,
        send({.operation = "ListObjectsV2", .method = "GET", .bucket = bucket, .query = query},
             deadline));
    ZW_ASSIGN_OR_RETURN(XmlLeaves xml,
                        XmlLeaves::parse(response.body, "ListObjectsV2 s3://" + bucket));
    for (const auto& [path, text] : xml.leaves) {
      if (path.ends_with("Contents/Key")) {
        objects.push_back({text, 0, ""});
      } else if (path.ends_with("Contents/Size") && !objects.empty()) {
        objects.back().size = std::strtoull(text.c_str(), nullptr, 10);
      } else if (path.ends_with("Contents/ETag") && !objects.empty()) {
        objects.back().etag = text;
      }
    }
    if (xml.first("ListBucketResult/IsTruncated") != "true") return objects;
    token = xml.first("ListBucketResult/NextContinuationToken");
    if (token.empty()) {
      return corrupt("ListObjectsV2 s3://" + bucket +
                     ": a truncated page without a "
                     "NextContinuationToken");
    }
  }
}

Result<std::vector<std::string>> S3Client::list_multipart_uploads(const std::string& bucket,
                                                                  const std::string& prefix,
                                                                  Deadline deadline) {
  // In SigV4's canonical order: prefix before uploads.
  const std::string query =
      (prefix.empty() ? "" : "prefix=" + sigv4::uri_encode(prefix, false) + "&") + "uploads=";
  ZW_ASSIGN_OR_RETURN(HttpResponse response, send({.operation = "ListMultipartUploads",
                                                    .method = "GET",
                                                    .bucket = bucket,
                                                    .query = query},
                                                   deadline));
  ZW_ASSIGN_OR_RETURN(XmlLeaves xml,
                      XmlLeaves::parse(response.body, "ListMultipartUploads s3://" + bucket));
  std::vector<std::string> keys;
  for (const auto& [path, text] : xml.leaves) {
    if (path.ends_with("Upload/Key")) keys.push_back(text);
  }
  return keys;
}

Status S3Client::put_multipart(const std::string& bucket, const std::string& key,
                               std::string_view body, uint64_t part_bytes, unsigned threads,
                               Deadline deadline) {
  constexpr uint64_t kMinPart = 5ull << 20;
  if (part_bytes < kMinPart) {
    return invalid_argument("multipart parts must be at least 5 MiB (S3's minimum), not " +
                            std::to_string(part_bytes));
  }
  ZW_ASSIGN_OR_RETURN(HttpResponse created, send({.operation = "CreateMultipartUpload",
                                                  .method = "POST",
                                                  .bucket = bucket,
                                                  .key = key,
                                                  .query = "uploads="},
                                                 deadline));
  ZW_ASSIGN_OR_RETURN(XmlLeaves created_xml,
                      XmlLeaves::parse(created.body, "CreateMultipartUpload"));
  const std::string upload_id = created_xml.first("UploadId");
  if (upload_id.empty())
    return corrupt("CreateMultipartUpload s3://" + bucket + "/" + key + ": no UploadId");
  const std::string id_query = "uploadId=" + sigv4::uri_encode(upload_id, false);

  const uint64_t parts = std::max<uint64_t>(1, (body.size() + part_bytes - 1) / part_bytes);
  std::vector<std::string> etags(parts);
  std::atomic<uint64_t> next{0};
  std::mutex mutex;
  Status first_error;
  auto upload_parts = [&] {
    for (uint64_t part; (part = next++) < parts;) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first_error.is_ok()) return;
      }
      const std::string_view piece = body.substr(
          part * part_bytes, std::min<uint64_t>(part_bytes, body.size() - part * part_bytes));
      auto response = send({.operation = "UploadPart " + std::to_string(part + 1),
                            .method = "PUT",
                            .bucket = bucket,
                            .key = key,
                            .query = "partNumber=" + std::to_string(part + 1) + "&" + id_query,
                            .body = piece},
                           deadline);
      std::lock_guard<std::mutex> lock(mutex);
      if (!response.is_ok()) {
        if (first_error.is_ok()) first_error = response.status();
      } else {
        etags[part] = response->header("etag");
      }
    }
  };
  std::vector<std::thread> workers;
  for (unsigned t = 1; t < std::clamp<uint64_t>(threads, 1, parts); ++t)
    workers.emplace_back(upload_parts);
  upload_parts();
  for (std::thread& w : workers) w.join();

  Status status = first_error;
  if (status.is_ok()) {
    std::string xml = "<CompleteMultipartUpload>";
    for (uint64_t p = 0; p < parts; ++p) {
      xml += "<Part><PartNumber>" + std::to_string(p + 1) + "</PartNumber><ETag>" + etags[p] +
             "</ETag></Part>";
    }
    xml += "</CompleteMultipartUpload>";
    auto completed = send({.operation = "CompleteMultipartUpload",
                           .method = "POST",
                           .bucket = bucket,
                           .key = key,
                           .query = id_query,
                           .body = xml},
                          deadline);
    status = completed.is_ok()
                 ? error_in_body(*completed, "CompleteMultipartUpload s3://" + bucket + "/" + key)
                 : completed.status();
  }
  if (!status.is_ok()) {
    // No parts left behind: they would be billed and never seen. The abort gets its own short
    // deadline, since the caller's may be what failed.
    (void)send({.operation = "AbortMultipartUpload",
                .method = "DELETE",
                .bucket = bucket,
                .key = key,
                .query = id_query},
               Deadline::after(std::chrono::seconds(30)));
  }
  return status;
}

}  // namespace zerowait::internal
