// Test helper: a blocking HTTP/1.1 client over one keep-alive connection (Boost.Beast), every
// operation bounded by a timeout.
#ifndef KILN_SERVE_INTERNAL_TEST_CLIENT_H_
#define KILN_SERVE_INTERNAL_TEST_CLIENT_H_

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <map>
#include <string>

namespace kiln::serve::testing {

struct ClientResponse {
  int status = 0;  // 0: the connection failed
  std::string body;
  std::map<std::string, std::string> headers;
  bool keep_alive = false;
};

class TestClient {
 public:
  explicit TestClient(int port) : stream_(ioc_) {
    boost::beast::error_code ec;
    stream_.expires_after(std::chrono::seconds(10));
    stream_.connect(boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"),
                                                   static_cast<unsigned short>(port)),
                    ec);
    connected_ = !ec;
  }
  bool connected() const { return connected_; }

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
    boost::beast::error_code ec;
    stream_.expires_after(std::chrono::seconds(10));
    http::write(stream_, req, ec);
    if (ec) return out;
    http::response_parser<http::string_body> parser;
    parser.body_limit(1 << 30);
    http::read(stream_, buffer_, parser, ec);
    if (ec) return out;
    auto& res = parser.get();
    out.status = res.result_int();
    out.body = res.body();
    out.keep_alive = res.keep_alive();
    for (const auto& f : res) out.headers[std::string(f.name_string())] = std::string(f.value());
    return out;
  }

  // Raw bytes, then whatever arrives until the server closes or 5 s pass.
  std::string SendRaw(const std::string& bytes) {
    boost::beast::error_code ec;
    stream_.expires_after(std::chrono::seconds(5));
    boost::asio::write(stream_.socket(), boost::asio::buffer(bytes), ec);
    std::string got;
    char buf[4096];
    for (;;) {
      size_t n = stream_.read_some(boost::asio::buffer(buf), ec);
      got.append(buf, n);
      if (ec) break;
    }
    return got;
  }

 private:
  boost::asio::io_context ioc_;
  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buffer_;
  bool connected_ = false;
};

}  // namespace kiln::serve::testing

#endif  // KILN_SERVE_INTERNAL_TEST_CLIENT_H_
