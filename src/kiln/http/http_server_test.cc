// The HTTP layer alone over 127.0.0.1: timeouts (idle, slow request), header limit, 100-continue,
// pipelining, 400 for malformed requests, the connection limit, draining on shutdown.
#include "kiln/http/http_server.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "kiln/http/internal/test_client.h"

namespace kiln::http {
namespace {

using testing::ClientResponse;
using testing::TestClient;

std::unique_ptr<HttpServer> StartEcho(HttpServerOptions o, std::atomic<int>* delay_ms = nullptr) {
  auto s = HttpServer::Start(o, [delay_ms](HttpRequest req, HttpReplier reply) {
    auto answer = [req = std::move(req), reply = std::move(reply)] {
      reply(HttpResponse{200, "text/plain", req.method + " " + req.target + " " + req.body, {}});
    };
    if (delay_ms != nullptr && delay_ms->load() > 0) {
      std::thread([answer, d = delay_ms->load()] {
        std::this_thread::sleep_for(std::chrono::milliseconds(d));
        answer();
      }).detach();
    } else {
      answer();
    }
  });
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(*s);
}

double SecondsUntilClosed(TestClient& c, const std::string& bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  c.SendRaw(bytes);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(HttpServerTest, IdleAndSlowRequestsAreClosedByTheTimeouts) {
  HttpServerOptions o;
  o.idle_timeout_ms = 300;
  o.read_timeout_ms = 300;
  auto s = StartEcho(o);
  TestClient idle(s->port());
  EXPECT_LT(SecondsUntilClosed(idle, ""), 3.0);  // nothing sent: closed after ~0.3 s
  TestClient slow(s->port());
  // Half a header, never finished (slowloris).
  EXPECT_LT(SecondsUntilClosed(slow, "POST /x HTTP/1.1\r\nHost: a\r\nContent-"), 3.0);
  TestClient body(s->port());
  EXPECT_LT(
      SecondsUntilClosed(body, "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\nab"),
      3.0);
}

TEST(HttpServerTest, HeaderLimitContinueAndPipelining) {
  HttpServerOptions o;
  o.max_header_bytes = 1024;
  auto s = StartEcho(o);
  {
    TestClient c(s->port());
    auto r = c.Send("GET", "/a", "", {{"X-Big", std::string(4000, 'x')}});
    EXPECT_EQ(r.status, 431);
  }
  {
    TestClient c(s->port());
    std::string got = c.SendRaw(
        "POST /c HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nExpect: 100-continue\r\n"
        "Connection: close\r\n\r\nhi");
    EXPECT_NE(got.find("HTTP/1.1 100 Continue"), std::string::npos) << got;
    EXPECT_NE(got.find("POST /c hi"), std::string::npos) << got;
  }
  {
    TestClient c(s->port());
    std::string got = c.SendRaw(
        "GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n"
        "GET /3 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    const size_t a = got.find("GET /1"), b = got.find("GET /2"), c3 = got.find("GET /3");
    ASSERT_NE(c3, std::string::npos) << got;
    EXPECT_LT(a, b);
    EXPECT_LT(b, c3);
  }
}

// What Beast cannot parse is answered 400 naming why, then the connection closes.
TEST(HttpServerTest, MalformedRequestsGet400) {
  auto s = StartEcho(HttpServerOptions{});
  for (const char* bad : {"G\x01T /a HTTP/1.1\r\nHost: a\r\n\r\n",
                          "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
                          "POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                          "zz\r\n"}) {
    TestClient c(s->port());
    std::string got = c.SendRaw(bad);
    EXPECT_EQ(got.rfind("HTTP/1.1 400", 0), 0u) << got;
    EXPECT_NE(got.find("malformed HTTP request: "), std::string::npos) << got;
  }
}

TEST(HttpServerTest, ConnectionLimit) {
  HttpServerOptions o;
  o.max_connections = 1;
  auto s = StartEcho(o);
  TestClient first(s->port());
  EXPECT_EQ(first.Send("GET", "/a").status, 200);
  TestClient second(s->port());
  EXPECT_EQ(second.Send("GET", "/b").status, 0);  // closed on accept
  EXPECT_EQ(first.Send("GET", "/c").status, 200);
}

TEST(HttpServerTest, ShutdownAnswersRequestsInFlight) {
  std::atomic<int> delay{400};
  auto s = StartEcho(HttpServerOptions{}, &delay);
  std::atomic<int> status{-1};
  std::thread t([&] {
    TestClient c(s->port());
    status = c.Send("POST", "/slow", "x").status;
  });
  for (int i = 0; i < 200 && s->in_flight() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(s->in_flight(), 1);
  s->Shutdown(5000);
  t.join();
  EXPECT_EQ(status.load(), 200);
  TestClient late(s->port());
  EXPECT_FALSE(late.connected() && late.Send("GET", "/a").status != 0);
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// TestClient against a listener that accepts and then never reads or answers: each call fails
// at the client's timeout, naming it, instead of hanging the test.
TEST(TestClientTest, CallsToAServerThatNeverAnswersFailAtTheTimeout) {
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::acceptor listener(
      ioc, boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
  const int port = listener.local_endpoint().port();
  constexpr std::chrono::milliseconds kTimeout(200);
  auto accept = [&] {
    boost::asio::ip::tcp::socket s(ioc);
    listener.accept(s);  // pending already: the client connected before
    return s;
  };

  TestClient reply(port, kTimeout);
  ASSERT_TRUE(reply.connected()) << reply.error();
  boost::asio::ip::tcp::socket silent = accept();
  auto t0 = std::chrono::steady_clock::now();
  ClientResponse r = reply.Send("GET", "/never");
  double took = SecondsSince(t0);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.error, "waiting for the response to GET /never: timed out after 200 ms");
  EXPECT_GE(took, 0.15);
  EXPECT_LT(took, 3.0);  // well under the default 10 s

  // A body larger than the socket buffers: the write itself cannot finish.
  TestClient write(port, kTimeout);
  ASSERT_TRUE(write.connected()) << write.error();
  boost::asio::ip::tcp::socket unread = accept();
  t0 = std::chrono::steady_clock::now();
  r = write.Send("POST", "/big", std::string(size_t{64} << 20, 'x'));
  took = SecondsSince(t0);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.error, "sending POST /big: timed out after 200 ms");
  EXPECT_GE(took, 0.15);
  EXPECT_LT(took, 3.0);

  TestClient raw(port, kTimeout);
  ASSERT_TRUE(raw.connected()) << raw.error();
  boost::asio::ip::tcp::socket mute = accept();
  t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(raw.SendRaw("GET / HTTP/1.1\r\nHost: a\r\n\r\n"), "");
  took = SecondsSince(t0);
  EXPECT_EQ(raw.error(), "reading until the server closes: timed out after 200 ms");
  EXPECT_GE(took, 0.15);
  EXPECT_LT(took, 3.0);
}

}  // namespace
}  // namespace kiln::http
