#include "storage/s3/sigv4.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <ctime>
#include <map>

#include "common/text.hpp"

namespace zerowait::internal::sigv4 {
namespace {

using Digest = std::vector<unsigned char>;

std::string hex(std::span<const unsigned char> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const unsigned char b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

Digest hmac_sha256(std::span<const unsigned char> key, std::string_view data) {
  Digest out(EVP_MAX_MD_SIZE);
  unsigned int size = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data(), &size);
  out.resize(size);
  return out;
}

bool is_unreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.' || c == '~';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Undoes percent-encoding ("%2F" -> "/"); a '%' not followed by two hex digits stays as it is.
// '+' stays '+': S3 and SigV4 do not use form encoding.
std::string uri_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size()) {
      const int hi = hex_value(text[i + 1]), lo = hex_value(text[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    out += text[i];
  }
  return out;
}

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (;;) {
    const size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

// The path with "." and ".." segments resolved and empty segments dropped; a trailing '/' stays.
std::string normalized_path(std::string_view path) {
  std::vector<std::string_view> kept;
  for (const std::string_view segment : split(path, '/')) {
    if (segment.empty() || segment == ".") continue;
    if (segment == "..") {
      if (!kept.empty()) kept.pop_back();
      continue;
    }
    kept.push_back(segment);
  }
  std::string out;
  for (const std::string_view segment : kept) {
    out += '/';
    out += segment;
  }
  const bool trailing_slash = path.ends_with('/') && !kept.empty();
  if (out.empty() || trailing_slash) out += '/';
  return out;
}

std::string canonical_uri(std::string_view path, PathRule rule) {
  if (path.empty()) return "/";
  if (rule == PathRule::kS3) return uri_encode(uri_decode(path), /*keep_slash=*/true);
  // The path as sent is encoded once already; SigV4 encodes it again for these services.
  return uri_encode(normalized_path(path), /*keep_slash=*/true);
}

std::string canonical_query(std::string_view query) {
  if (query.empty()) return "";
  std::vector<std::pair<std::string, std::string>> params;
  for (const std::string_view item : split(query, '&')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string_view name = item.substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? "" : item.substr(eq + 1);
    params.emplace_back(uri_encode(uri_decode(name), false), uri_encode(uri_decode(value), false));
  }
  std::sort(params.begin(), params.end());
  std::string out;
  for (const auto& [name, value] : params) {
    if (!out.empty()) out += '&';
    out += name + "=" + value;
  }
  return out;
}

// Leading and trailing spaces removed, runs of spaces inside made one. A value folded over
// several lines (obsolete HTTP line folding) is signed as its lines, each trimmed, joined with
// ',' — as AWS's test suite (get-header-value-multiline) has it.
std::string trimmed_value(std::string_view value) {
  std::string out;
  for (const std::string_view line : split(value, '\n')) {
    std::string trimmed;
    bool space = false;
    for (const char c : line) {
      if (c == ' ' || c == '\t' || c == '\r') {
        space = !trimmed.empty();
        continue;
      }
      if (space) trimmed += ' ';
      space = false;
      trimmed += c;
    }
    if (trimmed.empty()) continue;
    if (!out.empty()) out += ',';
    out += trimmed;
  }
  return out;
}

// Header name -> its values joined with ',' in the order sent; sorted by name.
std::map<std::string, std::string> canonical_headers(const Request& request) {
  std::map<std::string, std::string> headers;
  for (const auto& [name, value] : request.headers) {
    std::string& joined = headers[ascii_lower(name)];
    if (!joined.empty()) joined += ',';
    joined += trimmed_value(value);
  }
  return headers;
}

std::string signed_header_names(const std::map<std::string, std::string>& headers) {
  std::string out;
  for (const auto& [name, value] : headers) {
    if (!out.empty()) out += ';';
    out += name;
  }
  return out;
}

std::string credential_scope(const Scope& scope) {
  return scope.date_time.substr(0, 8) + "/" + scope.region + "/" + scope.service + "/aws4_request";
}

}  // namespace

std::string sha256_hex(std::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &size, EVP_sha256(), nullptr);
  return hex({digest, size});
}

std::string amz_date(std::chrono::system_clock::time_point time) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(time);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y%m%dT%H%M%SZ", &utc);
  return text;
}

std::string uri_encode(std::string_view text, bool keep_slash) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (is_unreserved(c) || (keep_slash && c == '/')) {
      out += ch;
    } else {
      out += '%';
      out += kDigits[c >> 4];
      out += kDigits[c & 15];
    }
  }
  return out;
}

std::string canonical_request(const Request& request, PathRule rule) {
  const auto headers = canonical_headers(request);
  std::string out = request.method + "\n" + canonical_uri(request.path, rule) + "\n" +
                    canonical_query(request.query) + "\n";
  for (const auto& [name, value] : headers) out += name + ":" + value + "\n";
  out += "\n" + signed_header_names(headers) + "\n" + request.payload_sha256;
  return out;
}

std::string string_to_sign(std::string_view canonical_request, const Scope& scope) {
  return "AWS4-HMAC-SHA256\n" + scope.date_time + "\n" + credential_scope(scope) + "\n" +
         sha256_hex(canonical_request);
}

std::string signature(std::string_view secret_access_key, const Scope& scope,
                      std::string_view string_to_sign) {
  const std::string first_key = "AWS4" + std::string(secret_access_key);
  const auto* key = reinterpret_cast<const unsigned char*>(first_key.data());
  Digest k = hmac_sha256({key, first_key.size()}, scope.date_time.substr(0, 8));
  k = hmac_sha256(k, scope.region);
  k = hmac_sha256(k, scope.service);
  k = hmac_sha256(k, "aws4_request");
  return hex(hmac_sha256(k, string_to_sign));
}

std::string authorization(const Request& request, const Credentials& credentials,
                          const Scope& scope, PathRule rule) {
  const std::string creq = canonical_request(request, rule);
  return "AWS4-HMAC-SHA256 Credential=" + credentials.access_key_id + "/" +
         credential_scope(scope) +
         ", SignedHeaders=" + signed_header_names(canonical_headers(request)) + ", Signature=" +
         signature(credentials.secret_access_key, scope, string_to_sign(creq, scope));
}

}  // namespace zerowait::internal::sigv4
