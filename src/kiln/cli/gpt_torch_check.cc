// CTest gpt_torch_logits: GPT checkpoints written by Kiln load by name into a GPT-2 written in
// another framework (plain PyTorch) and give the same logits. For each of two small configs it
//
//   1. trains with `kiln train` (examples/gpt_text.yaml, a few steps) and exports the run with
//      `kiln export --batch 2`, as a user would;
//   2. runs the exported artifact on Kiln's cpu backend for two token rows (GPL-3 bytes, then
//      seeded random ids) and writes tokens + logits to kiln_logits.safetensors;
//   3. writes the Hugging Face directory (config.json, model.safetensors) with
//      Gpt::ExportHuggingFace from the same weights;
//   4. runs scripts/check_gpt_torch.py, which loads the checkpoint shard, the artifact's
//      weights.safetensors and model.safetensors each by name into the torch GPT-2 and compares
//      its logits with Kiln's.
//
// usage: gpt_torch_check PYTHON WORKDIR
// Exit 77 (CTest SKIP_RETURN_CODE) when `PYTHON -c "import torch"` fails or GPL-3 is missing.
// WORKDIR is removed after a pass unless KILN_KEEP_OUTPUT is set (kept after a failure).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/cli/app.h"
#include "kiln/cli/backends.h"
#include "kiln/compiler/artifact.h"
#include "kiln/nn/gpt.h"
#include "kiln/tensor/safetensors.h"
#include "kiln/train/config.h"
#include "kiln/train/trainer.h"

namespace {

namespace fs = std::filesystem;
constexpr char kText[] = "/usr/share/common-licenses/GPL-3";
constexpr int kSkip = 77;

// fork + execv; returns the exit status (128 + signal if killed, -1 if it could not start).
int Spawn(const std::vector<std::string>& argv, bool quiet = false) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::cout.flush();
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (quiet) {
      FILE* null = std::fopen("/dev/null", "w");
      if (null != nullptr) {
        dup2(fileno(null), STDOUT_FILENO);
        dup2(fileno(null), STDERR_FILENO);
      }
    }
    execv(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
}

bool Kiln(std::vector<std::string> args) {
  args.insert(args.begin(), "kiln");
  std::ostringstream out, err;
  int code = kiln::cli::RunKiln(args, out, err);
  if (code != 0) {
    std::cout << "FAIL: kiln " << args[1] << " exited " << code << "\n" << out.str() << err.str();
  }
  return code == 0;
}

template <typename T>
bool Ok(const absl::StatusOr<T>& s, const std::string& what) {
  if (!s.ok()) std::cout << "FAIL: " << what << ": " << s.status() << "\n";
  return s.ok();
}
bool Ok(const absl::Status& s, const std::string& what) {
  if (!s.ok()) std::cout << "FAIL: " << what << ": " << s << "\n";
  return s.ok();
}

struct Case {
  std::string name;
  std::vector<std::string> sets;  // --set overrides of examples/gpt_text.yaml
};

// Steps 1-3 for one case; fills the python command's file arguments. False on failure.
bool Prepare(const Case& c, const std::string& work, std::vector<std::string>* files) {
  const std::string run = work + "/" + c.name + "/run", art = work + "/" + c.name + "/artifact",
                    hf = work + "/" + c.name + "/hf";
  fs::create_directories(hf);
  std::vector<std::string> train = {"train",
                                    std::string(KILN_SOURCE_DIR) + "/examples/gpt_text.yaml",
                                    "--no-resume", "--output-dir", run};
  for (const std::string& s : c.sets) {
    train.push_back("--set");
    train.push_back(s);
  }
  if (!Kiln(train) || !Kiln({"export", run, "--out", art, "--batch", "2"})) return false;

  // Kiln's logits: the exported artifact on the cpu backend.
  absl::StatusOr<kiln::compiler::Artifact> a = kiln::compiler::LoadArtifact(art);
  if (!Ok(a, "load " + art)) return false;
  const std::vector<kiln::compiler::TensorSpec> in = a->signature.RuntimeInputs();
  if (in.size() != 1 || in[0].name != "tokens" || in[0].shape.rank() != 2) {
    std::cout << "FAIL: " << art << ": expected one runtime input tokens[B, S]\n";
    return false;
  }
  absl::StatusOr<kiln::train::TrainConfig> config =
      kiln::train::LoadTrainConfig(run + "/config.yaml");
  if (!Ok(config, run + "/config.yaml")) return false;
  const int64_t vocab = config->model.vocab_size;
  const int64_t batch = in[0].shape.dim(0), seq = in[0].shape.dim(1);
  kiln::Tensor tokens(kiln::DType::kS32, in[0].shape);
  std::ifstream text(kText, std::ios::binary);
  std::mt19937 rng(4);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < seq; ++s) {
      int32_t id = static_cast<int32_t>(rng() % vocab);
      if (b == 0) id = static_cast<unsigned char>(text.get());  // real text: confident logits
      tokens.data<int32_t>()[b * seq + s] = id;
    }
  }
  absl::StatusOr<std::unique_ptr<kiln::runtime::Backend>> cpu = kiln::cli::MakeBackendByName("cpu");
  if (!Ok(cpu, "cpu backend")) return false;
  auto exe = (*cpu)->Compile(a->program);
  if (!Ok(exe, "compile " + art)) return false;
  absl::StatusOr<std::vector<kiln::Tensor>> args = a->BindInputs({{"tokens", tokens}});
  if (!Ok(args, "bind")) return false;
  absl::StatusOr<std::vector<kiln::Tensor>> outs = (*exe)->Run(*args);
  if (!Ok(outs, "run " + art)) return false;
  const std::string logits_path = work + "/" + c.name + "/kiln_logits.safetensors";
  if (!Ok(kiln::WriteSafetensors(logits_path, {{"tokens", tokens}, {"logits", (*outs)[0]}}),
          "write " + logits_path)) {
    return false;
  }

  // The Hugging Face directory from the same weights, via the model's own export.
  absl::StatusOr<std::unique_ptr<kiln::nn::Model>> model =
      kiln::train::BuildModel(config->model, config->data.seq_len, vocab);
  if (!Ok(model, "build model")) return false;
  const auto* gpt = dynamic_cast<const kiln::nn::Gpt*>(model->get());
  if (gpt == nullptr) return false;
  absl::StatusOr<kiln::nn::ParamStore> params = gpt->ImportHuggingFace(a->weights);
  if (!Ok(params, "import " + art) || !Ok(gpt->ExportHuggingFace(*params, hf), "export " + hf)) {
    return false;
  }

  *files = {"--config", hf + "/config.json", "--kiln-logits", logits_path};
  const std::string last = run + "/checkpoints/step_" + std::to_string(config->steps);
  for (const auto& e : fs::directory_iterator(last)) {
    if (e.path().extension() == ".safetensors") files->push_back(e.path().string());
  }
  files->push_back(art + "/weights.safetensors");
  files->push_back(hf + "/model.safetensors");
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: gpt_torch_check PYTHON WORKDIR\n";
    return 2;
  }
  const std::string python = argv[1], work = argv[2];
  if (Spawn({python, "-c", "import torch"}, /*quiet=*/true) != 0) {
    std::cout << "SKIP: '" << python
              << " -c \"import torch\"' fails (no PyTorch to compare with)\n";
    return kSkip;
  }
  if (!fs::exists(kText)) {
    std::cout << "SKIP: no " << kText << " (Debian's base-files) to train on\n";
    return kSkip;
  }
  fs::remove_all(work);
  const std::vector<Case> cases = {
      // The example config as shipped (2 layers, 2 heads, width 64, seq 64).
      {"example", {"steps=30", "eval_every=0", "log_every=30"}},
      // Other shapes: 4 heads of 8, one layer, a vocabulary past 256, wpe longer than the sequence.
      {"variant",
       {"steps=25", "eval_every=0", "log_every=25", "model.n_layer=1", "model.n_head=4",
        "model.n_embd=32", "model.vocab_size=300", "model.n_ctx=80", "data.seq_len=48"}},
  };
  bool ok = true;
  for (const Case& c : cases) {
    std::cout << "== " << c.name << "\n";
    std::vector<std::string> files;
    if (!Prepare(c, work, &files)) {
      ok = false;
      continue;
    }
    std::vector<std::string> cmd = {python,
                                    std::string(KILN_SOURCE_DIR) + "/scripts/check_gpt_torch.py"};
    cmd.insert(cmd.end(), files.begin(), files.end());
    int rc = Spawn(cmd);
    if (rc != 0) {
      std::cout << "FAIL: check_gpt_torch.py exited " << rc << "\n";
      if (rc == kSkip) return kSkip;
      ok = false;
    }
  }
  if (ok && !std::getenv("KILN_KEEP_OUTPUT")) fs::remove_all(work);
  std::cout << (ok ? "PASS" : "FAIL") << "\n";
  return ok ? 0 : 1;
}
