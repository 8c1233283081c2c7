// Deterministic fuzz drivers (fixed seeds, a few seconds) for what a client controls: the infer
// body (random bytes, truncated JSON, wrong shapes and dtypes, huge declared sizes, binary header
// lengths past the end) into the parser and into the server's handler with a real model, and raw
// bytes into the HTTP layer. The contract: a clean answer every time (OK or InvalidArgument from
// the parser; 200 or 4xx from the server, never 5xx; an HTTP answer or a closed connection), and
// the server still serving afterwards. serve_asan_fuzz_test runs this file under ASan and UBSan,
// where any out-of-bounds access, use after free, leak or undefined behaviour fails it.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>
#include <future>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kiln/http/http_server.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/serve/internal/test_model.h"
#include "kiln/serve/oip.h"
#include "kiln/serve/server.h"
#include "tests/support/temp_dir.h"

namespace kiln::serve {
namespace {

// Values a fuzzer reaches for: bounds, overflows, wrong types.
const char* const kNastyInts[] = {"0",
                                  "1",
                                  "-1",
                                  "2",
                                  "8",
                                  "9",
                                  "65536",
                                  "2147483648",
                                  "4294967296",
                                  "4611686018427387904",
                                  "9223372036854775807",
                                  "-9223372036854775808",
                                  "18446744073709551616",
                                  "1e308",
                                  "1.5",
                                  "-0",
                                  "null",
                                  "true",
                                  "\"4\"",
                                  "[]",
                                  "{}"};
const char* const kShapes[] = {"[1,4]",
                               "[2,4]",
                               "[8,4]",
                               "[9,4]",
                               "[0,4]",
                               "[-1,4]",
                               "[4]",
                               "[1,4,1]",
                               "[]",
                               "[1,5]",
                               "[4611686018427387904,4]",
                               "[9223372036854775807,9223372036854775807]",
                               "[65536,65536]",
                               "[1,-4]",
                               "[1,4.5]",
                               "[\"1\",4]",
                               "[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,4]",
                               "4",
                               "null"};
const char* const kDatatypes[] = {"FP32",  "FP16",  "BF16",        "FP64",  "INT8",
                                  "UINT8", "INT32", "INT64",       "BOOL",  "BYTES",
                                  "fp32",  "",      "FP32\\u0000", "UINT64"};
const char* const kData[] = {
    "[0.5,-1,2,0.25]",
    "[[0.5,-1,2,0.25]]",
    "[[0.5,-1,2,0.25],[1,1,1,1]]",
    "[0.5,-1,2]",
    "[0.5,-1,2,0.25,1]",
    "[true,false,true,false]",
    "[1,2,3,4,5,6,7,8]",
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
    "[1e400,-1e400,1,1]",
    "[null,1,2,3]",
    "[\"a\",1,2,3]",
    "[{},1,2,3]",
    "[300,-300,1,1]",
    "[]",
    "{}",
    "1",
};
const char* const kTokens[] = {"{", "}", "[", "]",  ",",    ":",    "\"",  "0",    "1",    "9",
                               "-", "e", ".", "\\", "null", "true", "\\u", "\xff", "\x00", " "};

std::string Pick(std::mt19937& rng, const char* const* list, size_t n) { return list[rng() % n]; }
#define KILN_PICK(rng, list) Pick(rng, list, sizeof(list) / sizeof(list[0]))

struct Fuzzed {
  std::string json;
  std::string binary;
  std::string header_length;  // Inference-Header-Content-Length; empty: none
};

// One request body: a valid one (rows x 4 FP32, as JSON data or binary), each field of which is
// swapped for one of the lists above with probability 1/4, then (in half the bodies) byte-level
// damage: a token inserted, a range cut out or repeated, a truncation; now and then random bytes.
Fuzzed MakeBody(std::mt19937& rng) {
  auto nasty = [&rng] { return rng() % 4 == 0; };
  Fuzzed f;
  const int rows = 1 + rng() % 8;
  const bool binary = rng() % 3 == 0;
  std::string input = absl::StrCat(
      "{\"name\":\"", nasty() ? "y" : "x",
      "\",\"shape\":", nasty() ? KILN_PICK(rng, kShapes) : absl::StrCat("[", rows, ",4]"),
      ",\"datatype\":\"", nasty() ? KILN_PICK(rng, kDatatypes) : "FP32", "\"");
  if (binary) {
    absl::StrAppend(&input, ",\"parameters\":{\"binary_data_size\":",
                    nasty() ? KILN_PICK(rng, kNastyInts) : std::to_string(rows * 16), "}");
    const size_t n = nasty() ? rng() % 80 : rows * 16;
    for (size_t i = 0; i < n; ++i) f.binary.push_back(static_cast<char>(rng() % 64));
  } else if (nasty()) {
    absl::StrAppend(&input, ",\"data\":", KILN_PICK(rng, kData));
  } else {
    std::string data = "[";
    for (int i = 0; i < rows * 4; ++i)
      absl::StrAppend(&data, i ? "," : "", static_cast<int>(rng() % 200) - 100, ".5");
    absl::StrAppend(&input, ",\"data\":", data, "]");
  }
  input += "}";
  std::string inputs = input;
  if (rng() % 10 == 0) inputs += "," + input;  // the same input twice
  f.json = absl::StrCat("{\"id\":\"", rng() % 1000, "\",\"inputs\":[", inputs, "]");
  if (rng() % 3 == 0)
    absl::StrAppend(&f.json,
                    ",\"parameters\":{\"priority\":", nasty() ? KILN_PICK(rng, kNastyInts) : "1",
                    ",\"binary_data_output\":", nasty() ? "1" : "true", "}");
  if (rng() % 3 == 0)
    absl::StrAppend(&f.json, ",\"outputs\":[{\"name\":\"",
                    nasty() ? "nope" : (rng() % 2 ? "logits" : "prediction"),
                    "\",\"parameters\":{\"binary_data\":", nasty() ? "0" : "true", "}}]");
  f.json += "}";
  const int damage = rng() % 2 == 0 ? 0 : 1 + rng() % 3;
  for (int d = 0; d < damage && !f.json.empty(); ++d) {
    const size_t at = rng() % f.json.size();
    switch (rng() % 4) {
      case 0:
        f.json.insert(at, KILN_PICK(rng, kTokens));
        break;
      case 1:
        f.json.erase(at, 1 + rng() % 6);
        break;
      case 2:
        f.json.insert(at, f.json.substr(at, rng() % 12));
        break;
      default:
        f.json.resize(at);  // truncated
    }
  }
  if (rng() % 20 == 0) {  // random bytes
    f.json.resize(rng() % 100);
    for (char& c : f.json) c = static_cast<char>(rng());
  }
  if (binary || rng() % 10 == 0) {
    const size_t total = f.json.size() + f.binary.size();
    if (!nasty()) {
      f.header_length = std::to_string(f.json.size());
    } else if (rng() % 3 == 0) {
      f.header_length = std::to_string(total + 1 + rng() % 100);  // past the end
    } else if (rng() % 2 == 0) {
      f.header_length = KILN_PICK(rng, kNastyInts);
    } else {
      f.header_length = std::to_string(rng() % (total + 1));  // anywhere inside
    }
  }
  return f;
}

constexpr int64_t kMaxElements = 1 << 16;

TEST(ParserFuzzTest, EveryBodyParsesOrIsInvalidArgument) {
  std::mt19937 rng(20261202);
  int ok = 0;
  for (int i = 0; i < 20000; ++i) {
    Fuzzed f = MakeBody(rng);
    absl::StatusOr<InferBody> b = ParseInferRequest(f.json, f.binary, kMaxElements);
    if (!b.ok()) {
      ASSERT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument)
          << b.status() << " for " << f.json;
      ASSERT_FALSE(b.status().message().empty());
      continue;
    }
    ++ok;
    for (const InferInput& in : b->inputs) {
      ASSERT_LE(in.tensor.num_elements(), kMaxElements) << f.json;
      for (int64_t e = 0; e < in.tensor.num_elements(); ++e) (void)in.tensor.GetDouble(e);
    }
  }
  EXPECT_GT(ok, 3000);  // the generator reaches past the parser's first checks
}

// The server's handler (the whole REST path minus the socket) with a real model: 200 or 4xx with
// an {"error": ...} body, never 5xx, every request answered.
TEST(ServerFuzzTest, EveryRequestIsAnswered200Or4xx) {
  const std::string dir = test_support::MakeTempDir("fuzz_test");
  ASSERT_TRUE(testing::WriteTestMlp(dir + "/mlp").ok());
  std::unique_ptr<runtime::Backend> backend = runtime::MakeCpuBackend();
  ServerOptions o;
  o.max_input_elements = kMaxElements;
  InferenceServer server(o);
  BatchingConfig c;
  c.max_batch_size = 8;
  c.preferred_batch_sizes = {4};
  auto m = ServedModel::Load(dir + "/mlp", "mlp", "1", c, backend.get());
  ASSERT_TRUE(m.ok()) << m.status();
  server.registry().Put(std::move(*m));
  const char* const targets[] = {
      "/v2/models/mlp/infer",  "/v2/models/mlp/versions/1/infer", "/v2/models/mlp/versions/9/infer",
      "/v2/models/nope/infer", "/v2/models/mlp/versions//infer",  "/v2/models/mlp/infer?x=%00",
      "/v2/repository/index"};
  std::mt19937 rng(11);
  int answered_200 = 0;
  for (int i = 0; i < 3000; ++i) {
    Fuzzed f = MakeBody(rng);
    HttpRequest req;
    req.method = rng() % 20 == 0 ? "GET" : "POST";
    req.target = rng() % 5 == 0 ? KILN_PICK(rng, targets) : "/v2/models/mlp/infer";
    req.body = f.json + f.binary;
    if (!f.header_length.empty())
      req.headers.emplace_back("inference-header-content-length", f.header_length);
    req.remote = "fuzz";
    std::promise<HttpResponse> answer;
    std::future<HttpResponse> got = answer.get_future();
    server.Handle(std::move(req), [&answer](HttpResponse r) { answer.set_value(std::move(r)); });
    ASSERT_EQ(got.wait_for(std::chrono::seconds(20)), std::future_status::ready) << f.json;
    HttpResponse r = got.get();
    if (r.status == 200) {
      ++answered_200;
      continue;
    }
    ASSERT_TRUE(r.status >= 400 && r.status < 500)
        << r.status << " " << r.body << " for " << f.json << " / " << f.header_length;
    ASSERT_EQ(r.body.rfind("{\"error\":", 0), 0u) << r.body;
  }
  EXPECT_GT(answered_200, 150);  // the model ran on many of them
  server.Shutdown(5000);
}

// A raw connection: writes `bytes`, half-closes, reads until the server closes (5 s at most).
std::string Exchange(int port, const std::string& bytes) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "socket failed";
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string got;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    shutdown(fd, SHUT_WR);
    char buf[4096];
    for (;;) {
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
  } else {
    got = "connect failed";
  }
  close(fd);
  return got;
}

// Every status line in an answer stream ("HTTP/1.1 200 OK\r\n...HTTP/1.1 400 ...").
std::vector<int> StatusCodes(const std::string& answer) {
  std::vector<int> codes;
  for (size_t at = answer.find("HTTP/1.1 "); at != std::string::npos;
       at = answer.find("HTTP/1.1 ", at + 1)) {
    if (at + 12 <= answer.size()) codes.push_back(std::atoi(answer.substr(at + 9, 3).c_str()));
  }
  return codes;
}

TEST(HttpFuzzTest, RawBytesGetAnAnswerOrAClose) {
  HttpServerOptions o;
  o.max_body_bytes = 4096;
  o.max_header_bytes = 1024;
  o.idle_timeout_ms = 2000;
  o.read_timeout_ms = 2000;
  o.threads = 2;
  auto s = HttpServer::Start(o, [](HttpRequest req, HttpReplier reply) {
    reply(HttpResponse{200, "text/plain", absl::StrCat(req.body.size()), {}});
  });
  ASSERT_TRUE(s.ok()) << s.status();
  const int port = (*s)->port();
  const char* const methods[] = {"GET", "POST", "PUT", "BREW", "", "G\x01T", "POST POST"};
  const char* const versions[] = {"HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/1.", "HTP/1.1", ""};
  const char* const headers[] = {"Content-Length: 4",
                                 "Content-Length: -1",
                                 "Content-Length: 99999999999999999999999",
                                 "Content-Length: 1000000",
                                 "Content-Length: 4, 5",
                                 "Content-Length: 4\r\nContent-Length: 6",
                                 "Content-Length: 0x10",
                                 "Transfer-Encoding: chunked",
                                 "Transfer-Encoding: gzip, chunked",
                                 "Expect: 100-continue",
                                 "Connection: close",
                                 "Connection: keep-alive",
                                 "Inference-Header-Content-Length: 99999",
                                 "NoColonHere",
                                 ": empty name",
                                 "X: \x7f\x80\xff",
                                 " Folded: continuation"};
  const char* const chunked[] = {"4\r\nabcd\r\n0\r\n\r\n",
                                 "fffffffffffffffffff\r\nab\r\n",
                                 "-1\r\nab\r\n",
                                 "zz\r\n",
                                 "4\r\nab",
                                 "0\r\n\r\n",
                                 "1000000\r\nab\r\n"};
  std::mt19937 rng(5);
  int answered = 0;
  for (int i = 0; i < 400; ++i) {
    std::string req;
    if (rng() % 8 == 0) {
      req.resize(rng() % 300);
      for (char& c : req) c = static_cast<char>(rng());
    } else {
      const std::string method = rng() % 3 == 0 ? KILN_PICK(rng, methods) : "POST";
      const std::string target = rng() % 10 == 0 ? std::string(rng() % 2000, 'a') : "x";
      const std::string version = rng() % 3 == 0 ? KILN_PICK(rng, versions) : "HTTP/1.1";
      req = absl::StrCat(method, " /", target, " ", version, "\r\nHost: a\r\n");
      const int n = rng() % 4;
      bool is_chunked = false;
      for (int h = 0; h < n; ++h) {
        std::string line = KILN_PICK(rng, headers);
        is_chunked |= line.find("chunked") != std::string::npos;
        req += line + "\r\n";
      }
      if (rng() % 10 == 0) req += std::string(1500, 'h') + ": v\r\n";  // over the header limit
      req += "\r\n";
      req += is_chunked ? KILN_PICK(rng, chunked) : std::string(rng() % 8, 'b');
      if (rng() % 4 == 0) req.resize(rng() % (req.size() + 1));  // cut anywhere
    }
    const std::string answer = Exchange(port, req);
    for (int code : StatusCodes(answer)) {
      ++answered;
      ASSERT_TRUE(code == 100 || code == 200 || (code >= 400 && code < 500))
          << code << " for " << absl::CEscape(req) << "\n"
          << absl::CEscape(answer);
    }
  }
  EXPECT_GT(answered, 200);  // most get an answer (400 for what Beast cannot parse)
  const std::string after = Exchange(port, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n");
  ASSERT_EQ(StatusCodes(after), std::vector<int>{200}) << after;
  (*s)->Shutdown(2000);
}

}  // namespace
}  // namespace kiln::serve
