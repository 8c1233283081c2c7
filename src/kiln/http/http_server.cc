#include "kiln/http/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <map>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "kiln/base/log.h"
#include "kiln/base/mutex.h"
#include "kiln/http/response.h"

namespace kiln::http {

namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

const std::string* HttpRequest::Header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return &v;
  return nullptr;
}

namespace {
class Session;
}  // namespace

struct HttpServer::Impl {
  HttpServerOptions options;
  HttpHandler handler;
  std::atomic<int64_t>* in_flight = nullptr;
  std::atomic<int> connections{0};
  std::atomic<bool> stopping{false};
  Mutex mu;
  std::map<Session*, std::weak_ptr<Session>> sessions ABSL_GUARDED_BY(mu);
  // Declared last: destroyed first (the acceptor before the io_context it uses).
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  // Keeps run() going while a request waits for its model (no I/O pending then) and after the
  // acceptor closes, until Shutdown has drained.
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;

  explicit Impl(int threads) : ioc(threads) { work.emplace(net::make_work_guard(ioc)); }
  void Accept();
  void CloseIdleSessions();
};

namespace {

// A request Beast could not parse (bad method, target, version, header field, Content-Length or
// chunk): the client's error, answered 400 before closing. The stream ending, stalling or
// breaking off mid-request is not (the connection just closes).
bool IsMalformed(const beast::error_code& ec) {
  if (ec.category() != bhttp::make_error_code(bhttp::error::bad_method).category()) return false;
  return ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message &&
         ec != bhttp::error::need_more && ec != bhttp::error::need_buffer &&
         ec != bhttp::error::end_of_chunk && ec != bhttp::error::buffer_overflow &&
         ec != bhttp::error::stale_parser;
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& socket, HttpServer::Impl* impl) : stream_(std::move(socket)), impl_(impl) {
    beast::error_code ec;
    auto ep = stream_.socket().remote_endpoint(ec);
    if (!ec) remote_ = absl::StrCat(ep.address().to_string(), ":", ep.port());
  }
  ~Session() {
    Done();
    MutexLock lock(impl_->mu);
    impl_->sessions.erase(this);
    impl_->connections--;
  }

  void Start() {
    {
      MutexLock lock(impl_->mu);
      impl_->sessions[this] = weak_from_this();
    }
    net::dispatch(stream_.get_executor(),
                  beast::bind_front_handler(&Session::ReadHeader, shared_from_this()));
  }

  void CloseIfIdle() {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      if (!self->busy_) self->Close();
    });
  }

 private:
  using Ms = std::chrono::milliseconds;

  void ReadHeader() {
    if (impl_->stopping) return Close();
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(impl_->options.max_header_bytes));
    parser_->body_limit(static_cast<uint64_t>(impl_->options.max_body_bytes));
    // Bytes already buffered: a pipelined request has started; else the connection is idle.
    stream_.expires_after(
        Ms(buffer_.size() > 0 ? impl_->options.read_timeout_ms : impl_->options.idle_timeout_ms));
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             beast::bind_front_handler(&Session::OnHeader, shared_from_this()));
  }

  void Begin() {
    if (!busy_) {
      busy_ = true;
      impl_->in_flight->fetch_add(1);
    }
  }
  void Done() {
    if (busy_) {
      busy_ = false;
      impl_->in_flight->fetch_sub(1);
    }
  }

  void OnHeader(beast::error_code ec, size_t) {
    if (ec == bhttp::error::body_limit) return Refuse(413, "request body too large");
    if (ec == bhttp::error::header_limit) return Refuse(431, "request header too large");
    if (IsMalformed(ec)) return Refuse(400, "malformed HTTP request: " + ec.message());
    if (ec) return Close();  // end of stream, timeout, reset
    Begin();
    auto& req = parser_->get();
    version_ = req.version();
    stream_.expires_after(Ms(impl_->options.read_timeout_ms));
    if (auto n = parser_->content_length(); n && *n > 0) req.body().reserve(*n);
    if (beast::iequals(req[bhttp::field::expect], "100-continue")) {
      auto cont =
          std::make_shared<bhttp::response<bhttp::empty_body>>(bhttp::status::continue_, version_);
      bhttp::async_write(stream_, *cont,
                         [self = shared_from_this(), cont](beast::error_code ec, size_t) {
                           if (ec) return self->Close();
                           self->ReadBody();
                         });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    bhttp::async_read(stream_, buffer_, *parser_,
                      beast::bind_front_handler(&Session::OnBody, shared_from_this()));
  }

  void OnBody(beast::error_code ec, size_t) {
    if (ec == bhttp::error::body_limit) return Refuse(413, "request body too large");
    if (IsMalformed(ec)) return Refuse(400, "malformed HTTP request: " + ec.message());
    if (ec) return Close();
    auto& req = parser_->get();
    HttpRequest r;
    r.method = std::string(req.method_string());
    r.target = std::string(req.target());
    r.body = std::move(req.body());
    for (const auto& f : req)
      r.headers.emplace_back(absl::AsciiStrToLower(std::string(f.name_string())),
                             std::string(f.value()));
    r.remote = remote_;
    keep_alive_ = req.keep_alive();
    stream_.expires_never();  // the handler may wait for a batch; the write has its own timeout
    auto self = shared_from_this();
    auto once = std::make_shared<std::atomic<bool>>(false);
    impl_->handler(std::move(r), [self, once](HttpResponse resp) {
      if (once->exchange(true)) return;
      net::post(self->stream_.get_executor(),
                [self, resp = std::move(resp)]() mutable { self->Write(std::move(resp), false); });
    });
  }

  // An error answered before the request was read whole: the connection closes after it.
  void Refuse(int status, const std::string& message) {
    Begin();
    Write(ErrorResponse(status, message), true);
  }

  void Write(HttpResponse resp, bool force_close) {
    auto res = std::make_shared<bhttp::response<bhttp::string_body>>(
        static_cast<bhttp::status>(resp.status), version_);
    res->set(bhttp::field::server, "kiln");
    res->set(bhttp::field::content_type, resp.content_type);
    for (const auto& [k, v] : resp.headers) res->set(k, v);
    res->body() = std::move(resp.body);
    const bool close = force_close || !keep_alive_ || impl_->stopping;
    res->keep_alive(!close);
    res->prepare_payload();
    stream_.expires_after(Ms(impl_->options.write_timeout_ms));
    bhttp::async_write(stream_, *res,
                       [self = shared_from_this(), res, close](beast::error_code ec, size_t) {
                         self->Done();
                         if (ec) return self->Close();
                         if (close) return self->Linger();
                         self->ReadHeader();
                       });
  }

  // Half-closes and reads (discarding) for up to a second, so the client sees the response
  // rather than a reset for the body it is still sending.
  void Linger() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(Ms(1000));
    stream_.async_read_some(net::buffer(scratch_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->Close();
                              self->Linger();
                            });
  }

  void Close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  beast::tcp_stream stream_;
  HttpServer::Impl* impl_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::string remote_;
  unsigned version_ = 11;
  bool keep_alive_ = true;
  bool busy_ = false;  // a request read and not yet answered
  char scratch_[4096];
};

}  // namespace

void HttpServer::Impl::Accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (!stopping && acceptor.is_open()) Accept();
      return;
    }
    if (stopping) return;
    if (connections.load() >= options.max_connections) {
      KILN_LOG(WARNING) << "kiln serve: refusing a connection: " << options.max_connections
                        << " connections open (--max-connections)";
      beast::error_code ignored;
      socket.close(ignored);
    } else {
      connections++;
      std::make_shared<Session>(std::move(socket), this)->Start();
    }
    Accept();
  });
}

void HttpServer::Impl::CloseIdleSessions() {
  std::vector<std::shared_ptr<Session>> live;
  {
    MutexLock lock(mu);
    for (auto& [p, w] : sessions)
      if (auto s = w.lock()) live.push_back(std::move(s));
  }
  for (auto& s : live) s->CloseIfIdle();
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              HttpHandler handler) {
  if (options.threads < 1 || options.threads > 256)
    return absl::InvalidArgumentError(
        absl::StrCat("threads is ", options.threads, "; it must be in [1, 256]"));
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->impl_ = std::make_unique<Impl>(options.threads);
  Impl& impl = *s->impl_;
  impl.options = options;
  impl.handler = std::move(handler);
  impl.in_flight = &s->in_flight_;
  const std::string where = absl::StrCat(options.host, ":", options.port);
  beast::error_code ec;
  net::ip::address address = net::ip::make_address(options.host, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("host '", options.host, "': ", ec.message()));
  tcp::endpoint ep(address, static_cast<unsigned short>(options.port));
  impl.acceptor.open(ep.protocol(), ec);
  if (!ec) impl.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl.acceptor.bind(ep, ec);
  if (!ec) impl.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("listening on ", where, ": ", ec.message()));
  s->port_ = impl.acceptor.local_endpoint().port();
  impl.Accept();
  for (int i = 0; i < options.threads; ++i) s->threads_.emplace_back([&impl] { impl.ioc.run(); });
  return s;
}

void HttpServer::Shutdown(int64_t drain_ms) {
  if (shut_down_) return;
  shut_down_ = true;
  Impl* impl = impl_.get();
  impl->stopping = true;
  net::post(impl->ioc, [impl] {
    beast::error_code ec;
    impl->acceptor.close(ec);
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(drain_ms);
  impl->CloseIdleSessions();
  while (in_flight_.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  // Answers are written by now; give the writes a moment to leave.
  impl->CloseIdleSessions();
  for (int i = 0;
       i < 100 && impl->connections.load() > 0 && std::chrono::steady_clock::now() < deadline; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  impl->work.reset();
  impl->ioc.stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

HttpServer::~HttpServer() {
  Shutdown(0);
  impl_.reset();
}

}  // namespace kiln::http
