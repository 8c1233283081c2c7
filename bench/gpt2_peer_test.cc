// The PyTorch peer's GPT-2 (bench/peer_torch.py) is Kiln's nn::Gpt: same parameters by Hugging
// Face name and shape on a tiny config, logits equal to the transformers port that
// scripts/check_gpt_torch.py pins Kiln's GPT to, and the gpt2_small rows' configuration on both
// sides. Skipped where /usr/bin/python3 cannot import torch.
#include <sys/wait.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "bench/gpt2_bench.h"
#include "gtest/gtest.h"
#include "kiln/nn/gpt.h"

namespace kiln::bench {
namespace {

constexpr int kSkip = 77;  // peer_torch.py: torch not importable

// Runs peer_torch.py with `args`; its stdout and exit status.
std::pair<std::string, int> RunPeer(const std::string& args) {
  const std::string cmd = "/usr/bin/python3 " KILN_SOURCE_DIR "/bench/peer_torch.py " + args;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {"", -1};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int status = pclose(p);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

// "[32,96]" -> "32x96".
std::string PeerShape(const Shape& shape) {
  std::string s;
  for (int i = 0; i < shape.rank(); ++i) s += (i ? "x" : "") + std::to_string(shape.dim(i));
  return s;
}

TEST(Gpt2PeerTest, PeerModelIsKilnsGptOnATinyConfig) {
  const nn::GptConfig config{.vocab_size = 50, .context = 16, .dim = 32, .layers = 2, .heads = 2};
  auto [out, rc] = RunPeer("--check-gpt2 50 16 32 2 2");
  if (rc == kSkip || rc == 127) GTEST_SKIP() << out;
  ASSERT_EQ(rc, 0) << out;
  std::vector<std::string> peer, kiln;
  std::istringstream in(out);
  std::string word, name, shape;
  while (in >> word) {
    if (word == "param" && in >> name >> shape) peer.push_back(name + " " + shape);
  }
  for (const nn::ParamSpec& spec : nn::Gpt(config).Params())
    kiln.push_back(spec.name + " " + PeerShape(spec.shape));
  EXPECT_EQ(peer, kiln);
  EXPECT_NE(out.find("\nok"), std::string::npos) << out;
}

TEST(Gpt2PeerTest, BothSidesRunTheSameGpt2Small) {
  const nn::GptConfig c = Gpt2Small();
  int64_t params = 0;
  for (const nn::ParamSpec& spec : nn::Gpt(c).Params()) params += spec.shape.num_elements();
  EXPECT_EQ(params, 124439808);  // GPT-2 small (Hugging Face "gpt2")
  // 3x the forward: ~387 GFLOP per step at batch 4 x 128 (issue 14's 386).
  EXPECT_NEAR(3 * GptForwardFlops(c, kGptTrainBatch) * 1e-9, 387.0, 1.0);
  auto [out, rc] = RunPeer("--gpt2-small-config");
  if (rc == kSkip || rc == 127) GTEST_SKIP() << out;
  ASSERT_EQ(rc, 0) << out;
  std::ostringstream want;
  want << "config " << c.vocab_size << " " << c.context << " " << c.dim << " " << c.layers << " "
       << c.heads << " " << kGptSeq << " " << kGptTrainBatch << "\n";
  EXPECT_EQ(out, want.str());
}

}  // namespace
}  // namespace kiln::bench
