#include "testing/fault_proxy.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <stdexcept>

#include "testing/http_wire.hpp"

namespace zerowait::testing {
namespace {

// The head without the headers named (lowercase), ending in "\r\n\r\n".
std::string without_header(const std::string& head, const std::string& name) {
  std::string out;
  size_t start = 0;
  while (start <= head.size()) {
    size_t end = head.find("\r\n", start);
    if (end == std::string::npos) end = head.size();
    const std::string line = head.substr(start, end - start);
    const size_t colon = line.find(':');
    if (start == 0 || colon == std::string::npos || lowercase(line.substr(0, colon)) != name) {
      out += line + "\r\n";
    }
    start = end + 2;
  }
  return out + "\r\n";
}

// A chunked body as it came (sizes, data, trailers), for forwarding; nullopt on EOF.
std::optional<std::string> read_chunked(SocketReader& reader) {
  std::string raw;
  for (;;) {
    const std::optional<std::string> size_line = reader.read_line();
    if (!size_line) return std::nullopt;
    raw += *size_line + "\r\n";
    uint64_t size = 0;
    try {
      size = std::stoull(*size_line, nullptr, 16);
    } catch (const std::exception&) {
      return std::nullopt;
    }
    if (size == 0) break;
    const std::optional<std::string> data = reader.read_exact(size + 2);  // with its "\r\n"
    if (!data) return std::nullopt;
    raw += *data;
  }
  for (;;) {  // trailers, up to the empty line
    const std::optional<std::string> line = reader.read_line();
    if (!line) return std::nullopt;
    raw += *line + "\r\n";
    if (line->empty()) return raw;
  }
}

// What S3 answers with that status, so clients take the paths they take for the real thing.
std::string error_answer(int status) {
  const std::string code = status == 503   ? "SlowDown"
                           : status == 500 ? "InternalError"
                                           : "InjectedFault";
  const std::string body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>" + code +
                           "</Code><Message>injected by the test proxy</Message></Error>";
  return "HTTP/1.1 " + std::to_string(status) +
         " Injected\r\nContent-Type: application/xml\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Makes the close that follows (once serve() returns) abort the connection with RST instead of
// FIN: the client sees "connection reset by peer" (ECONNRESET), not a clean end of stream. No
// shutdown() here: it would send a FIN first, and the client would read an EOF.
void reset_connection(int fd) {
  const linger abort{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort, sizeof abort);
}

bool matches(const FaultProxy::Fault& fault, const std::string& method, const std::string& path) {
  return (fault.method.empty() || fault.method == method) &&
         path.find(fault.path_contains) != std::string::npos;
}

}  // namespace

FaultProxy::FaultProxy(const std::string& upstream, int port) {
  // "http://HOST:PORT" with an optional trailing path.
  const std::string scheme = "http://";
  if (!upstream.starts_with(scheme)) {
    throw std::invalid_argument("fault proxy: upstream '" + upstream +
                                "' is not an http:// URL");
  }
  const std::string authority = upstream.substr(scheme.size(), upstream.find('/', scheme.size()) -
                                                                   scheme.size());
  const size_t colon = authority.rfind(':');
  upstream_host_ = authority.substr(0, colon);
  try {
    upstream_port_ = colon == std::string::npos ? 80 : std::stoi(authority.substr(colon + 1));
  } catch (const std::exception&) {
    throw std::invalid_argument("fault proxy: upstream '" + upstream + "' has no valid port");
  }
  listener_.emplace(port, [this](int fd) { serve(fd); });
}

FaultProxy::~FaultProxy() = default;

std::string FaultProxy::url() const { return "http://127.0.0.1:" + std::to_string(port()); }

void FaultProxy::set_latency(std::chrono::milliseconds added) {
  std::lock_guard<std::mutex> lock(mutex_);
  latency_ = added;
}

void FaultProxy::set_bandwidth(uint64_t bytes_per_second) {
  std::lock_guard<std::mutex> lock(mutex_);
  bandwidth_ = bytes_per_second;
}

void FaultProxy::fail_next(const Fault& fault, int times) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (times > 0) rules_.push_back({fault, times});
}

void FaultProxy::fail_always(const Fault& fault) {
  std::lock_guard<std::mutex> lock(mutex_);
  rules_.push_back({fault, -1});
}

void FaultProxy::clear_faults() {
  std::lock_guard<std::mutex> lock(mutex_);
  rules_.clear();
}

uint64_t FaultProxy::faults_applied() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return faults_applied_;
}

std::vector<FaultProxy::Exchange> FaultProxy::log() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return log_;
}

uint64_t FaultProxy::count(std::string_view method, std::string_view path_contains) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<uint64_t>(std::count_if(log_.begin(), log_.end(), [&](const Exchange& e) {
    return !e.faulted && e.method == method && e.path.find(path_contains) != std::string::npos;
  }));
}

std::optional<FaultProxy::Fault> FaultProxy::take_fault(const std::string& method,
                                                        const std::string& path) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = rules_.begin(); it != rules_.end(); ++it) {
    if (!matches(it->fault, method, path)) continue;
    Fault fault = it->fault;
    ++faults_applied_;
    if (it->remaining > 0 && --it->remaining == 0) rules_.erase(it);
    return fault;
  }
  return std::nullopt;
}

bool FaultProxy::throttle(uint64_t bytes) {
  std::chrono::steady_clock::time_point done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (bandwidth_ == 0) return !listener_->stopping();
    // The link is one pipe shared by every connection: each piece waits for the ones before.
    const auto start = std::max(std::chrono::steady_clock::now(), link_free_at_);
    link_free_at_ =
        start + std::chrono::nanoseconds(static_cast<int64_t>(bytes * 1e9 / bandwidth_));
    done = link_free_at_;
  }
  return listener_->wait_or_stop(done - std::chrono::steady_clock::now());
}

double FaultProxy::seconds_since_start() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
}

void FaultProxy::record(Exchange exchange) {
  exchange.ended_s = seconds_since_start();
  std::lock_guard<std::mutex> lock(mutex_);
  log_.push_back(std::move(exchange));
}

void FaultProxy::serve(int client_fd) {
  SocketReader client(client_fd);
  int upstream_fd = -1;
  std::optional<SocketReader> upstream;
  auto close_upstream = [&] {
    if (upstream_fd < 0) return;
    listener_->track(upstream_fd, false);
    ::close(upstream_fd);
    upstream_fd = -1;
    upstream.reset();
  };

  while (!listener_->stopping()) {
    const std::optional<std::string> raw_head = client.read_head();
    if (!raw_head) break;
    const HttpHead request = parse_head(*raw_head);
    Exchange exchange{request.method(), request.target(), request.header("range")};
    exchange.began_s = seconds_since_start();
    // The proxy answers "100 Continue" itself and sends the server the whole request at once.
    if (lowercase(request.header("expect")) == "100-continue" &&
        !send_all(client_fd, "HTTP/1.1 100 Continue\r\n\r\n")) {
      break;
    }
    const std::string forward_head = without_header(*raw_head, "expect");
    std::optional<std::string> body = std::string();
    if (request.chunked()) {
      body = read_chunked(client);
    } else if (request.content_length()) {
      body = client.read_exact(*request.content_length());
    }
    if (!body) break;

    const std::optional<Fault> fault = take_fault(exchange.method, exchange.path);
    std::chrono::milliseconds latency;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      latency = latency_;
    }
    if (!listener_->wait_or_stop(latency)) break;
    if (fault && !fault->mid_body) {
      if (!listener_->wait_or_stop(fault->stall)) break;
      if (fault->reset || fault->status != 0) {
        exchange.faulted = true;
        exchange.status = fault->reset ? 0 : fault->status;
        record(exchange);
        if (fault->reset) {
          reset_connection(client_fd);
          break;
        }
        if (!send_all(client_fd, error_answer(fault->status))) break;
        continue;
      }
    }

    // To the server, on the kept connection; a kept connection the server has closed meanwhile
    // fails at once, and the request goes again on a new one.
    std::optional<std::string> answer_head;
    for (int attempt = 0; attempt < 2 && !answer_head; ++attempt) {
      if (upstream_fd < 0) {
        upstream_fd = connect_to(upstream_host_, upstream_port_);
        if (upstream_fd < 0) break;
        listener_->track(upstream_fd, true);
        upstream.emplace(upstream_fd);
      }
      if (send_all(upstream_fd, forward_head) && send_all(upstream_fd, *body)) {
        answer_head = upstream->read_head();
        // An interim answer (100 Continue) precedes the real one.
        while (answer_head && parse_head(*answer_head).status() / 100 == 1) {
          answer_head = upstream->read_head();
        }
      }
      if (!answer_head) close_upstream();
    }
    if (!answer_head) {
      exchange.status = 502;
      exchange.faulted = true;
      record(exchange);
      if (!send_all(client_fd, error_answer(502))) break;
      continue;
    }
    const HttpHead answer = parse_head(*answer_head);
    exchange.status = answer.status();
    const bool no_body = exchange.method == "HEAD" || exchange.status == 204 ||
                         exchange.status == 304;
    bool close_after = lowercase(answer.header("connection")) == "close";
    if (!send_all(client_fd, *answer_head + "\r\n\r\n")) break;

    if (no_body) {
      // nothing follows the head
    } else if (answer.chunked()) {
      const std::optional<std::string> chunked = read_chunked(*upstream);
      if (!chunked || !send_all(client_fd, *chunked)) break;
      exchange.body_bytes = chunked->size();
    } else {
      // A length, or (none given) everything until the server closes.
      const std::optional<uint64_t> length = answer.content_length();
      if (!length) close_after = true;
      const uint64_t total = length.value_or(UINT64_MAX);
      const uint64_t cut_at = fault && fault->mid_body ? (length ? total / 2 : 1) : UINT64_MAX;
      bool cut = false;
      while (exchange.body_bytes < total) {
        const uint64_t want = std::min<uint64_t>(
            {total - exchange.body_bytes, cut_at - exchange.body_bytes, 256 << 10});
        const std::string piece = upstream->read_some(want);
        if (piece.empty()) break;
        if (!throttle(piece.size()) || !send_all(client_fd, piece)) break;
        exchange.body_bytes += piece.size();
        if (exchange.body_bytes >= cut_at) {
          cut = true;
          break;
        }
      }
      if (cut) {
        exchange.faulted = true;
        record(exchange);
        listener_->wait_or_stop(fault->stall);
        reset_connection(client_fd);
        break;
      }
      if (length && exchange.body_bytes < total) break;  // the server or the client went away
    }
    record(exchange);
    if (close_after) break;
  }
  close_upstream();
}

}  // namespace zerowait::testing
