// Test helper: a blocking HTTP/1.1 client over one keep-alive connection (Boost.Beast), every
// operation bounded by a timeout, so that a test of a stuck server fails instead of hanging.
//
//   TestClient c(server->port());                        // connects; 10 s for each operation
//   ClientResponse r = c.Send("GET", "/v2/health/ready");
//   EXPECT_EQ(r.status, 200) << r.error;                 // status 0: r.error says why
//
// Beast's tcp_stream applies expires_after() to asynchronous operations only (its synchronous
// read, write and connect ignore it and can block forever), so each call here starts the
// asynchronous operation and runs the client's own io_context until it completes or the timer
// closes the socket. After a timeout the connection is closed: make a new client.
#ifndef KILN_HTTP_INTERNAL_TEST_CLIENT_H_
#define KILN_HTTP_INTERNAL_TEST_CLIENT_H_

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <map>
#include <string>

namespace kiln::http::testing {

struct ClientResponse {
  int status = 0;  // 0: the connection failed or an operation timed out (see `error`)
  std::string body;
  std::map<std::string, std::string> headers;
  bool keep_alive = false;
  std::string
      error;  // why status is 0, e.g. "waiting for the response ...: timed out after 10000 ms"
};

class TestClient {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout{10000};

  // Connects to 127.0.0.1:port. `timeout` bounds the connect and each later operation.
  explicit TestClient(int port, std::chrono::milliseconds timeout = kDefaultTimeout)
      : stream_(ioc_), timeout_(timeout) {
    const boost::asio::ip::tcp::endpoint to(boost::asio::ip::make_address("127.0.0.1"),
                                            static_cast<unsigned short>(port));
    connected_ = !Run("connecting to 127.0.0.1:" + std::to_string(port), timeout_,
                      Deadline(timeout_), [&](auto done) { stream_.async_connect(to, done); });
  }
  bool connected() const { return connected_; }
  // Why the last operation failed; "" when it did not.
  const std::string& error() const { return error_; }

  // One request and its response, each bounded by the timeout.
  ClientResponse Send(const std::string& method, const std::string& target,
                      const std::string& body = "",
                      const std::map<std::string, std::string>& headers = {}) {
    namespace http = boost::beast::http;
    ClientResponse out;
    http::request<http::string_body> req(http::string_to_verb(method), target, 11);
    req.set(http::field::host, "127.0.0.1");
    for (const auto& [k, v] : headers) req.set(k, v);
    req.body() = body;
    req.prepare_payload();
    const std::string what = method + " " + target;
    if (Run("sending " + what, timeout_, Deadline(timeout_),
            [&](auto done) { http::async_write(stream_, req, done); })) {
      out.error = error_;
      return out;
    }
    http::response_parser<http::string_body> parser;
    parser.body_limit(1 << 30);
    if (Run("waiting for the response to " + what, timeout_, Deadline(timeout_),
            [&](auto done) { http::async_read(stream_, buffer_, parser, done); })) {
      out.error = error_;
      return out;
    }
    auto& res = parser.get();
    out.status = res.result_int();
    out.body = res.body();
    out.keep_alive = res.keep_alive();
    for (const auto& f : res) out.headers[std::string(f.name_string())] = std::string(f.value());
    return out;
  }

  // Raw bytes, then whatever arrives until the server closes or the timeout (at most 5 s, the
  // whole read together) passes; error() tells which.
  std::string SendRaw(const std::string& bytes) {
    const std::chrono::milliseconds limit = std::min(timeout_, kRawWait);
    const Clock::time_point deadline = Deadline(limit);
    std::string got;
    if (Run("sending raw bytes", limit, deadline, [&](auto done) {
          boost::asio::async_write(stream_, boost::asio::buffer(bytes), done);
        })) {
      return got;
    }
    char buf[4096];
    for (;;) {
      size_t n = 0;
      const boost::beast::error_code ec =
          Run("reading until the server closes", limit, deadline, [&](auto done) {
            stream_.async_read_some(boost::asio::buffer(buf),
                                    [&n, done](boost::beast::error_code e, size_t k) {
                                      n = k;
                                      done(e);
                                    });
          });
      got.append(buf, n);
      if (ec) break;
    }
    return got;
  }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kRawWait{5000};

  static Clock::time_point Deadline(std::chrono::milliseconds d) { return Clock::now() + d; }

  // Starts an asynchronous operation (`start` is given its completion handler) and runs it until
  // it completes or `deadline` passes (the stream's timer then closes the socket). Returns its
  // error, recorded in error_ as "<what>: <why>"; a timeout names `limit`, the time it was given.
  template <typename Start>
  boost::beast::error_code Run(const std::string& what, std::chrono::milliseconds limit,
                               Clock::time_point deadline, Start start) {
    boost::beast::error_code result = boost::asio::error::would_block;
    stream_.expires_at(deadline);
    start([&result](boost::beast::error_code ec, auto&&...) { result = ec; });
    ioc_.restart();
    ioc_.run();
    error_.clear();
    if (result == boost::beast::error::timeout) {
      error_ = what + ": timed out after " + std::to_string(limit.count()) + " ms";
    } else if (result) {
      error_ = what + ": " + result.message();
    }
    return result;
  }

  boost::asio::io_context ioc_;
  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buffer_;
  std::chrono::milliseconds timeout_;
  bool connected_ = false;
  std::string error_;
};

}  // namespace kiln::http::testing

#endif  // KILN_HTTP_INTERNAL_TEST_CLIENT_H_
