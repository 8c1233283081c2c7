// A small HTTP/1.1 server on Boost.Beast: N I/O threads on one io_context, one strand per
// connection, keep-alive, pipelined requests answered in order, a body limit (413 above it,
// checked against Content-Length before the body is read), a header limit (431), `Expect:
// 100-continue` answered, an idle timeout (no request started) and a read timeout (a request
// started but not finished: a slow client cannot hold a connection), a connection limit.
// Handlers answer asynchronously, so an I/O thread never waits for a model.
//
//   HttpServerOptions o;  o.port = 0;  o.threads = 2;
//   auto server = HttpServer::Start(o, [](HttpRequest req, HttpReplier reply) {
//     reply(HttpResponse{200, "text/plain", "hi"});     // from any thread, exactly once
//   });
//   (*server)->port();                                   // the bound port
//   (*server)->Shutdown(30000);                          // stop accepting, finish in-flight
#ifndef KILN_HTTP_HTTP_SERVER_H_
#define KILN_HTTP_HTTP_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln::http {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path and query, e.g. "/v2/models/mlp/infer"
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string remote;                                        // "127.0.0.1:53312"

  // The first header called `name` (lower case), or null.
  const std::string* Header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
};

using HttpReplier = std::function<void(HttpResponse)>;
using HttpHandler = std::function<void(HttpRequest, HttpReplier)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: the kernel picks one (see port())
  int threads = 1;
  int64_t max_body_bytes = int64_t{64} << 20;
  int64_t max_header_bytes = 16 << 10;
  int64_t idle_timeout_ms = 60000;  // a keep-alive connection with no request
  int64_t read_timeout_ms = 30000;  // reading one request, header and body
  int64_t write_timeout_ms = 30000;
  int max_connections = 1024;
};

class HttpServer {
 public:
  // Binds and starts the I/O threads. Errors name the address (e.g. port in use).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           HttpHandler handler);
  ~HttpServer();  // Shutdown(0)

  int port() const { return port_; }
  // Stops accepting; requests already read are answered (until `drain_ms` has passed, then
  // connections are dropped), idle connections closed; joins the I/O threads. Idempotent.
  void Shutdown(int64_t drain_ms);
  // Requests read and not yet answered.
  int64_t in_flight() const { return in_flight_.load(); }

  struct Impl;

 private:
  HttpServer() = default;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  std::atomic<int64_t> in_flight_{0};
  std::vector<std::thread> threads_;
  bool shut_down_ = false;
};

}  // namespace kiln::http

#endif  // KILN_HTTP_HTTP_SERVER_H_
