// Training and inference against the PyTorch peer, in one run, alternating (DESIGN.md §5).
//
//   train_bench [--threads=2] [--rounds=5] [--max-seconds=20] [--peer=bench/peer_torch.py]
//               [--peer-blas-dir=DIR] [--peer-coretype=auto|NAME] [--no-peer]
//               [--out=bench/out/results.json] [--only=SUBSTRING] [--profile]
//               [--gpt2-rounds=3] [--no-gpt2] [--gpt2-scale]
//
// --only runs the benchmarks whose name contains SUBSTRING; --profile prints, after each one,
// Kiln's time per kind of thunk (from Executable's thunk observer). KILN_CPU_ISA=avx2 (or sse41,
// avx512, ...) runs it at that ISA level (bench/cpu_isa_env.h). Where oneDNN has no bf16 kernels
// (below avx512_core) there is no bf16 rate: the bf16 rows compute in f32 (float-normalization),
// their shares are of the f32 rate, and the bf16-against-f32 report says what bf16 buys there.
//
// The GPT-2-small rows (gpt2_small_train: AdamW, clip 1.0, batch 4 x 128 tokens;
// gpt2_small_infer_b1 / _b8: the logits) take ~2.5 s per training step per side, so they run
// --gpt2-rounds rounds (not --rounds, and not cut short by --max-seconds) and --no-gpt2 skips
// them. --gpt2-scale adds the same train step at GPT-2-medium width (gpt2_medium_train: d 1024,
// 24 layers, 16 heads, 355M parameters) and at seq_len 512 (gpt2_small_seq512_train), to show how
// time and memory grow (about 7 and 10 s per step per side here: minutes). Besides the step times
// they report each side's peak resident-set growth over the row (Kiln: this process, reset before
// the model is built; the peer: its own) and, for the train step, its roofline floor: the step's
// matmul FLOPs at the bare oneDNN f32 rate plus the bytes the optimizer must move (AdamW with
// clipping: 32 per parameter) at this machine's memcpy rate.
//
// The peer's OpenBLAS kernels (bench/peer_blas.h): the driver asks the peer which core type
// OpenBLAS picked and measures its 1024^3 f32 matmul beside oneDNN's. When OpenBLAS fell back to
// generic kernels (or to kernels older than the CPU runs), a second peer is started with
// OPENBLAS_CORETYPE set to the newest core type the CPU supports; it replaces the first when its
// matmul checks out against a float64 product and (unless the first was a generic fallback) is
// faster. --peer-coretype=NAME forces a core type instead (e.g. Prescott, to see the fallback).
// When the peer's matmul still runs at under half of oneDNN's rate, its ratios are printed and
// written as not comparable.
//
// The peer (peer_torch.py, Debian's python3-torch under /usr/bin/python3) runs as ONE persistent
// subprocess started with its tuned environment (OMP/OpenBLAS threads = --threads, passive OMP
// waiting, glibc malloc never unmapping, OPENBLAS_CORETYPE/L2_SIZE unset). Debian's torch runs
// f32 matmuls through libblas.so.3; when that is the netlib reference BLAS (no OpenBLAS
// installed) the peer is ~30x slower than tuned, so the driver puts Debian's OpenBLAS
// (libopenblas0-pthread's folder, or --peer-blas-dir) first on the peer's LD_LIBRARY_PATH and warns
// when the peer still reports the reference BLAS. It reads commands on
// stdin and answers one line each:
//   setup <bench>        -> "ok" after building the model and warming up, or "skip <reason>"
//   run <bench> <reps>   -> "times <ms> <ms> ..." (one timing per rep)
//   quit
// Each benchmark runs `rounds` rounds; a round is a few reps of Kiln, then the same reps of the
// peer (the order flips every round), so both sides see the same machine noise. Each side's
// round starts with one untimed step, and a 300 ms pause separates the sides (OpenBLAS workers
// spin after a call). Reported: medians
// of all reps and the ratio Kiln / peer (< 1: Kiln faster). Also printed, Kiln only: the bare
// oneDNN matmul rate on the same threads (each model's FLOP/s as a share of it), cold compile
// time, and the per-thunk dispatch overhead of a graph of many tiny ops.
#include <malloc.h>
#include <omp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "bench/cpu_isa_env.h"
#include "bench/gpt2_bench.h"
#include "bench/peer_blas.h"
#include "bench/timing.h"
#include "kiln/base/memory.h"
#include "kiln/base/status.h"
#include "kiln/compiler/cache.h"
#include "kiln/ir/builder.h"
#include "kiln/nn/gpt.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/optim.h"
#include "kiln/nn/params.h"
#include "kiln/nn/train_step.h"
#include "kiln/nn/transformer.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/runtime/cpu/machine.h"

namespace kiln {
namespace {

using bench::Median;
using bench::Seconds;

// ---------------------------------------------------------------------------------------------
// The peer subprocess.

class Peer {
 public:
  // Starts `script` under the tuned environment; nullopt (with a message) if it cannot start.
  // `blas_dir` (may be empty) goes first on the peer's LD_LIBRARY_PATH, so torch's libblas.so.3
  // resolves to the OpenBLAS there instead of whatever the system alternative is.
  // `coretype` (may be empty: OpenBLAS picks) becomes OPENBLAS_CORETYPE.
  static std::unique_ptr<Peer> Start(const std::string& script, int threads,
                                     const std::string& blas_dir, const std::string& coretype) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) return nullptr;
    pid_t pid = fork();
    if (pid < 0) return nullptr;
    if (pid == 0) {
      dup2(to_child[0], 0);
      dup2(from_child[1], 1);
      close(to_child[1]);
      close(from_child[0]);
      std::string t = std::to_string(threads);
      std::string omp = "OMP_NUM_THREADS=" + t, blas = "OPENBLAS_NUM_THREADS=" + t;
      const char* old_path = std::getenv("LD_LIBRARY_PATH");
      std::string ld = "LD_LIBRARY_PATH=" + blas_dir;
      if (old_path && *old_path) ld += (blas_dir.empty() ? "" : ":") + std::string(old_path);
      // OPENBLAS_CORETYPE=X (or unset it, when empty: `env -u X` then the harmless `A=` pair).
      std::string core_unset = coretype.empty() ? "OPENBLAS_CORETYPE" : "KILN_UNUSED";
      std::string core_set = coretype.empty() ? "KILN_UNUSED=" : "OPENBLAS_CORETYPE=" + coretype;
      execl("/usr/bin/env", "env", "-u", core_unset.c_str(), "-u", "OPENBLAS_L2_SIZE",
            core_set.c_str(), ld.c_str(), omp.c_str(), blas.c_str(), "OMP_WAIT_POLICY=PASSIVE",
            "GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296",
            "/usr/bin/python3", script.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    auto p = std::unique_ptr<Peer>(new Peer);
    p->pid_ = pid;
    p->in_ = fdopen(to_child[1], "w");
    p->out_ = fdopen(from_child[0], "r");
    std::string hello = p->Command("");  // the peer prints "ready" after importing torch
    if (hello.rfind("ready", 0) != 0) {
      std::fprintf(stderr, "peer did not start (got '%s')\n", hello.c_str());
      return nullptr;
    }
    p->version_ = hello.size() > 6 ? hello.substr(6) : "";
    return p;
  }

  ~Peer() {
    if (in_) {
      std::fputs("quit\n", in_);
      std::fclose(in_);
    }
    if (out_) std::fclose(out_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }

  // Sends one command (none when empty) and returns the reply line ("" on EOF).
  std::string Command(const std::string& cmd) {
    if (!cmd.empty()) {
      std::fputs((cmd + "\n").c_str(), in_);
      std::fflush(in_);
    }
    std::string line;
    int c;
    while ((c = std::fgetc(out_)) != EOF && c != '\n') line.push_back(static_cast<char>(c));
    return line;
  }

  // "skip <why>" or "" when ready.
  std::string Setup(const std::string& bench) {
    std::string r = Command("setup " + bench);
    return r == "ok" ? "" : (r.empty() ? "peer exited" : r);
  }

  std::vector<double> Run(const std::string& bench, int reps) {
    std::istringstream in(Command("run " + bench + " " + std::to_string(reps)));
    std::string word;
    in >> word;
    std::vector<double> ms;
    double v;
    while (in >> v) ms.push_back(v);
    return ms;
  }

  const std::string& version() const { return version_; }

  // OpenBLAS's core type ("unknown" when the BLAS is not OpenBLAS).
  std::string BlasCore() {
    std::string r = Command("blas");
    size_t at = r.find("core="), end = r.find(' ', at);
    return at == std::string::npos ? "unknown" : r.substr(at + 5, end - at - 5);
  }

  // The peer's n^3 f32 matmul: GFLOP/s and its worst relative error against float64.
  struct MatmulCheck {
    double gflops = 0, max_error = 1;
  };
  MatmulCheck Matmul(int n, int reps) {
    std::istringstream in(Command("matmul " + std::to_string(n) + " " + std::to_string(reps)));
    std::string word;
    MatmulCheck c;
    if (!(in >> word >> c.gflops >> c.max_error) || word != "matmul") return MatmulCheck{};
    return c;
  }

 private:
  Peer() = default;
  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
  std::string version_;
};

// What the peer's BLAS runs on, as chosen by StartTunedPeer (results.json "peer_blas").
struct PeerBlas {
  std::string default_core;   // the core type OpenBLAS picked by itself ("" when forced)
  std::string core;           // the core type the peer runs ("unknown": not OpenBLAS)
  std::string coretype;       // OPENBLAS_CORETYPE given to the peer ("": none)
  double default_gflops = 0;  // its 1024^3 f32 matmul with default_core
  Peer::MatmulCheck matmul;   // its 1024^3 f32 matmul as it runs, and its error
  std::string note;
};

// Starts the peer with its best BLAS setup (the header comment; bench/peer_blas.h).
std::unique_ptr<Peer> StartTunedPeer(const std::string& script, int threads,
                                     const std::string& blas_dir, const std::string& coretype_flag,
                                     const bench::CpuInfo& cpu, PeerBlas* info) {
  info->coretype = coretype_flag == "auto" ? "" : coretype_flag;
  std::unique_ptr<Peer> peer = Peer::Start(script, threads, blas_dir, info->coretype);
  if (!peer) return nullptr;
  info->core = peer->BlasCore();
  info->matmul = peer->Matmul(1024, 10);
  if (!info->coretype.empty()) {
    info->note = "core type forced by --peer-coretype";
    return peer;
  }
  info->default_core = info->core;
  info->default_gflops = info->matmul.gflops;
  std::string best = bench::BestOpenBlasCore(cpu);
  bool generic = bench::IsGenericOpenBlasCore(info->core, cpu);
  int level = bench::OpenBlasCoreLevel(info->core);
  bool older = level >= 0 && level < bench::CpuBlasLevel(cpu);
  if (info->core == "unknown" || best.empty() || !(generic || older)) return peer;
  std::printf(
      "peer: OpenBLAS picked %s kernels (%.1f GFLOP/s) on a CPU that runs %s's%s; "
      "trying OPENBLAS_CORETYPE=%s\n",
      info->core.c_str(), info->matmul.gflops, best.c_str(), generic ? " (a generic fallback)" : "",
      best.c_str());
  std::unique_ptr<Peer> alt = Peer::Start(script, threads, blas_dir, best);
  if (!alt) {
    info->note = "a peer with OPENBLAS_CORETYPE=" + best + " did not start";
    return peer;
  }
  std::string alt_core = alt->BlasCore();
  Peer::MatmulCheck m = alt->Matmul(1024, 10);
  char buf[256];
  if (alt_core != best || m.max_error > 1e-5) {
    std::snprintf(buf, sizeof(buf),
                  "OPENBLAS_CORETYPE=%s rejected (runs %s, max relative error %.3g > 1e-5)",
                  best.c_str(), alt_core.c_str(), m.max_error);
  } else if (!generic && m.gflops <= 1.05 * info->matmul.gflops) {
    std::snprintf(buf, sizeof(buf), "OPENBLAS_CORETYPE=%s not faster (%.1f vs %.1f GFLOP/s)",
                  best.c_str(), m.gflops, info->matmul.gflops);
  } else {
    std::snprintf(buf, sizeof(buf),
                  "OPENBLAS_CORETYPE=%s: %.1f GFLOP/s (was %.1f with %s), max relative error %.3g",
                  best.c_str(), m.gflops, info->matmul.gflops, info->core.c_str(), m.max_error);
    peer = std::move(alt);
    info->core = alt_core;
    info->coretype = best;
    info->matmul = m;
  }
  info->note = buf;
  std::printf("peer: %s\n", buf);
  return peer;
}

// ---------------------------------------------------------------------------------------------
// Kiln workloads.

Tensor RandomTensor(DType dt, Shape shape, uint32_t seed, double lo = -1, double hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(shape.num_elements());
  for (double& x : v) x = dist(rng);
  return Tensor::FromDoubles(dt, shape, v);
}

Tensor RandomLabels(int64_t n, int classes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = static_cast<int32_t>(rng() % classes);
  return Tensor::FromVector(Shape{n}, v);
}

// Token ids [batch, seq] uniform in [0, vocab).
Tensor RandomTokens(int64_t batch, int64_t seq, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(batch * seq);
  for (int32_t& x : v) x = static_cast<int32_t>(rng() % vocab);
  return Tensor::FromVector(Shape{batch, seq}, v);
}

nn::OptimizerConfig AdamW() {
  nn::OptimizerConfig c;
  c.kind = nn::OptimizerKind::kAdamW;
  c.schedule.lr = 1e-3;
  c.weight_decay_min_rank = 0;  // torch.optim.AdamW decays every parameter
  return c;
}

// A prepared benchmark: `step` runs once; `flops` is the model's FLOPs per step (0: none).
struct Workload {
  std::function<void()> step;
  double flops = 0;
  double compile_s = 0;
  int thunks = 0;
  int64_t arena_bytes = 0;
  // Train steps only, for the compile and memory report: the backend compile alone, cold and on a
  // compile-cache hit (into fresh memory, then into memory a freed executable left behind); the
  // arena's lower bound; the resident parameters and optimizer state (both ping-pong sets).
  double compile_backend_s = 0, compile_hit_s = 0, compile_hit_recycled_s = 0;
  int64_t lower_bound_bytes = 0, state_bytes = 0;
  bool train = false;
  // The bytes a step must move outside its matmuls at the least (the roofline floor; 0: none).
  double min_bytes = 0;
  // This process's peak resident-set growth from before the model was built to the end of the
  // row (-1: not measured).
  int64_t rss_delta = -1;
  runtime::Executable* exe = nullptr;  // for --profile
};

constexpr int64_t kMlpWidth = 1024;
const std::vector<int64_t> kMlpHidden = {kMlpWidth, kMlpWidth, kMlpWidth};
constexpr int64_t kD = 256, kHeads = 4, kFf = 1024, kSeq = 128, kEncBatch = 32;

double MlpForwardFlops(int64_t batch) {
  return 2.0 * batch * (3 * kMlpWidth * kMlpWidth + kMlpWidth * 10);
}
double EncoderForwardFlops(int64_t batch) {
  double per_token = 2.0 * kD * 3 * kD + 2.0 * kD * kD + 2.0 * 2 * kD * kFf + 2.0 * 2 * kSeq * kD;
  return per_token * batch * kSeq;
}

using bench::AdamWClipBytes;
using bench::Gpt2Medium;
using bench::Gpt2Small;
using bench::GptForwardFlops;
using bench::kGptSeq;
using bench::kGptTrainBatch;

nn::TransformerBlock EncoderBlock(DType dt = DType::kF32) {
  return nn::TransformerBlock("enc",
                              {.dim = kD,
                               .num_heads = kHeads,
                               .mlp_hidden = kFf,
                               .fused_qkv = true,
                               .activation = nn::Activation::kRelu,
                               .norm_epsilon = 1e-5},
                              /*dropout_site=*/0, dt);
}

// loss = mean((block(x) - target)^2) (in f32), x and target `dt` [B, S, D].
absl::StatusOr<ir::Graph> EncoderGraph(int64_t batch, bool loss, DType dt = DType::kF32) {
  nn::TransformerBlock block = EncoderBlock(dt);
  KILN_RETURN_IF_ERROR(block.Validate());
  ir::Builder b(loss ? "encoder_loss" : "encoder_forward");
  nn::ParamValues p = nn::AddParameters(b, block.Params());
  ir::Value x = b.Parameter("x", dt, {batch, kSeq, kD});
  ir::Value y = block.Apply(p, x, nn::RngInputs{});
  if (loss) {
    ir::Value t = b.Parameter("target", dt, {batch, kSeq, kD});
    ir::Value d = ir::Convert(y - t, DType::kF32);
    b.Output("loss", ir::Mean(d * d, {0, 1, 2}));
  } else {
    b.Output("y", y);
  }
  return b.Build();
}

absl::StatusOr<ir::Graph> MlpForwardGraph(const nn::MlpClassifier& mlp, int64_t batch) {
  ir::Builder b("mlp_forward");
  nn::ParamValues p = nn::AddParameters(b, mlp.Params());
  ir::Value x = b.Parameter("x", mlp.options().dtype, {batch, kMlpWidth});
  b.Output("logits", mlp.Logits(p, x));
  return b.Build();
}

// Keeps everything a workload's closure needs alive.
struct Holder {
  std::unique_ptr<nn::TrainStep> train;
  std::unique_ptr<runtime::Executable> exe;
  std::vector<Tensor> tensors;
  std::vector<const Tensor*> in;
  std::vector<Tensor*> out;
};

// `measure_hits`: also compile the step twice more (compile-cache hits; each a second resident
// copy of the parameters and state while it lives).
absl::StatusOr<Workload> TrainWorkload(runtime::Backend& backend, const ir::Graph& loss,
                                       const std::vector<nn::ParamSpec>& specs,
                                       std::vector<Tensor> data, double flops,
                                       const nn::OptimizerConfig& optimizer = AdamW(),
                                       bool measure_hits = true) {
  auto h = std::make_shared<Holder>();
  KILN_ASSIGN_OR_RETURN(nn::ParamStore params, nn::InitParams(specs, 0));
  double t0 = Seconds();
  KILN_ASSIGN_OR_RETURN(
      h->train, nn::TrainStep::Create(backend, loss, std::move(params), {.optimizer = optimizer}));
  double t1 = Seconds();
  h->tensors = std::move(data);
  for (const Tensor& t : h->tensors) h->in.push_back(&t);
  Workload w;
  w.step = [h] { KILN_CHECK_OK(h->train->Run(h->in).status()); };
  w.flops = flops;
  w.compile_s = t1 - t0;
  w.thunks = h->train->executable().num_thunks();
  w.exe = &h->train->mutable_executable();
  w.arena_bytes = h->train->executable().plan().arena_bytes;
  w.lower_bound_bytes = h->train->executable().plan().lower_bound_bytes;
  for (const nn::ParamStore* store : {&h->train->params(), &h->train->optimizer_state()})
    for (int i = 0; i < store->size(); ++i)
      w.state_bytes += store->value(i).byte_size();  // one set: TrainStep updates in place
  w.compile_backend_s = h->train->compile_seconds();
  w.train = true;
  if (!measure_hits) return w;
  for (double* hit : {&w.compile_hit_s, &w.compile_hit_recycled_s}) {
    KILN_ASSIGN_OR_RETURN(nn::ParamStore again_params, nn::InitParams(specs, 0));
    KILN_ASSIGN_OR_RETURN(
        std::unique_ptr<nn::TrainStep> again,
        nn::TrainStep::Create(backend, loss, std::move(again_params), h->train->options()));
    *hit = again->compile_seconds();
  }
  return w;
}

// Compiles `graph` and binds its parameters: model parameters from `specs` (seed 0), the rest
// from `data` in order.
absl::StatusOr<Workload> InferWorkload(runtime::Backend& backend, const ir::Graph& graph,
                                       const std::vector<nn::ParamSpec>& specs,
                                       std::vector<Tensor> data, double flops) {
  auto h = std::make_shared<Holder>();
  KILN_ASSIGN_OR_RETURN(nn::ParamStore params, nn::InitParams(specs, 0));
  double t0 = Seconds();
  KILN_ASSIGN_OR_RETURN(h->exe, backend.Compile(graph));
  double t1 = Seconds();
  const ir::Graph& g = h->exe->graph();
  size_t next_data = 0;
  for (int id : g.parameters()) {
    const std::string& name = g.node(id).attr_str("name");
    if (const Tensor* p = params.Find(name)) {
      h->tensors.push_back(*p);
    } else if (next_data < data.size()) {
      h->tensors.push_back(data[next_data++]);
    } else {
      return absl::InvalidArgumentError("no input for parameter " + name);
    }
  }
  for (const ir::Output& o : g.outputs())
    h->tensors.emplace_back(g.node(o.node).type().dtype, g.node(o.node).type().shape);
  size_t np = g.parameters().size();
  for (size_t i = 0; i < h->tensors.size(); ++i) {
    if (i < np)
      h->in.push_back(&h->tensors[i]);
    else
      h->out.push_back(&h->tensors[i]);
  }
  Workload w;
  w.step = [h] { KILN_CHECK_OK(h->exe->RunInto(h->in, h->out)); };
  w.flops = flops;
  w.compile_s = t1 - t0;
  w.thunks = h->exe->num_thunks();
  w.exe = h->exe.get();
  w.arena_bytes = h->exe->plan().arena_bytes;
  return w;
}

// y = ((x * a + b) * a + b) ... : `ops` tiny elementwise thunks on f32[8].
absl::StatusOr<Workload> DispatchWorkload(runtime::Backend& backend, int ops) {
  ir::Builder b("dispatch");
  ir::Value x = b.Parameter("x", DType::kF32, {8});
  ir::Value a = b.Parameter("a", DType::kF32, {8});
  ir::Value c = b.Parameter("b", DType::kF32, {8});
  ir::Value y = x;
  for (int i = 0; i < ops / 2; ++i) y = y * a + c;
  b.Output("y", y);
  KILN_ASSIGN_OR_RETURN(ir::Graph g, b.Build());
  return InferWorkload(backend, g, {},
                       {RandomTensor(DType::kF32, Shape{8}, 1),
                        Tensor::FromDoubles(DType::kF32, Shape{8}, std::vector<double>(8, 0.5)),
                        RandomTensor(DType::kF32, Shape{8}, 2)},
                       0);
}

// Runs `steps` steps with a thunk observer and prints where the time goes, grouped by the
// thunk's name without its node id ("add %12 (onednn binary)" -> "add (onednn binary)").
void PrintProfile(const std::string& name, Workload& w, int steps) {
  if (!w.exe) return;
  std::unordered_map<std::string, std::pair<double, int>> by_kind;
  std::vector<double> per_thunk(w.exe->num_thunks(), 0);
  std::vector<std::string> kinds(w.exe->num_thunks());
  for (int i = 0; i < w.exe->num_thunks(); ++i) {
    std::string n = w.exe->thunk(i).name();
    size_t pct = n.find(" %");
    if (pct != std::string::npos) {
      size_t sp = n.find(' ', pct + 1);
      n = n.substr(0, pct) + (sp == std::string::npos ? "" : n.substr(sp));
    }
    kinds[i] = n;
  }
  double total = 0;
  w.exe->set_thunk_observer([&](int t, int64_t s, int64_t e) {
    auto& [ms, count] = by_kind[kinds[t]];
    ms += (e - s) * 1e-6;
    per_thunk[t] += (e - s) * 1e-6;
    ++count;
    total += (e - s) * 1e-6;
  });
  double t0 = Seconds();
  for (int i = 0; i < steps; ++i) w.step();
  double wall = (Seconds() - t0) * 1e3 / steps;
  w.exe->set_thunk_observer(nullptr);
  std::vector<std::pair<double, std::string>> sorted;
  for (auto& [k, v] : by_kind) sorted.push_back({v.first / steps, k});
  std::sort(sorted.rbegin(), sorted.rend());
  std::printf("profile %s: %.3f ms/step wall, %.3f ms in %d thunks\n", name.c_str(), wall,
              total / steps, w.exe->num_thunks());
  for (size_t i = 0; i < sorted.size() && i < 16; ++i)
    std::printf("  %8.3f ms %5.1f%%  x%-4d %s\n", sorted[i].first,
                100 * sorted[i].first / (total / steps), by_kind[sorted[i].second].second / steps,
                sorted[i].second.c_str());
  // The slowest single thunks, with their operand types (matmuls also with their rate).
  const ir::Graph& g = w.exe->graph();
  std::vector<std::pair<double, int>> slow;
  for (int t = 0; t < w.exe->num_thunks(); ++t) slow.push_back({per_thunk[t] / steps, t});
  std::sort(slow.rbegin(), slow.rend());
  std::printf("  slowest thunks:\n");
  for (size_t i = 0; i < slow.size() && i < 12; ++i) {
    std::string name = w.exe->thunk(slow[i].second).name();
    std::string detail;
    size_t pct = name.find('%');
    int id = pct == std::string::npos ? -1 : std::atoi(name.c_str() + pct + 1);
    if (id >= 0 && id < g.num_nodes()) {
      const ir::Node& n = g.node(id);
      for (int op : n.operands()) detail += " " + g.node(op).type().ToString();
      detail += " -> " + n.type().ToString();
      if (n.opcode() == ir::Opcode::kDotGeneral) {
        // 2 * output elements * contracted size.
        int64_t k = 1;
        for (int64_t d : n.attr_ints("lhs_contracting"))
          k *= g.node(n.operand(0)).type().shape.dim(d);
        double flops = 2.0 * n.type().shape.num_elements() * k;
        char buf[64];
        std::snprintf(buf, sizeof(buf), "  %.0f GFLOP/s", flops / (slow[i].first * 1e-3) * 1e-9);
        detail += buf;
      }
    }
    std::printf("    %8.3f ms  %s |%s\n", slow[i].first, name.c_str(), detail.c_str());
  }
}

// ---------------------------------------------------------------------------------------------
// The driver.

struct Row {
  std::string name;
  double kiln_ms = 0, peer_ms = 0;  // peer_ms 0: no peer number
  double flops = 0;
  std::string note;
  int rounds = 0;
  bool bf16 = false;     // a bf16 row: its FLOP/s is a share of Bench::Rate(true)
  double min_bytes = 0;  // the step's bytes outside its matmuls (Workload::min_bytes)
  // The fastest and slowest timed rep of each side (0: none).
  double kiln_lo = 0, kiln_hi = 0, peer_lo = 0, peer_hi = 0;
  // Page faults (minor + major) of this process per timed Kiln step: median and most.
  double kiln_faults = 0, kiln_faults_max = 0;
};

// Page faults (minor + major) this process has taken so far.
int64_t PageFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt + u.ru_majflt;
}

// Whether Kiln / peer ratios mean anything: false when the peer's matmul runs at under half of
// oneDNN's (a crippled BLAS), set once both rates are measured.
bool g_peer_comparable = true;

// The ratio column: "-" without a peer, "n/c" when the peer is not comparable.
std::string RatioText(double kiln_ms, double peer_ms) {
  if (peer_ms <= 0 || kiln_ms <= 0) return "-";
  if (!g_peer_comparable) return "n/c";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4f", kiln_ms / peer_ms);
  return buf;
}

// Alternating rounds: Kiln then peer, peer then Kiln, ... `reps` timed steps per side per round
// after `warmup` untimed Kiln steps (the peer warms up in its setup).
Row RunPair(const std::string& name, Workload& w, Peer* peer, int rounds, int reps, int warmup,
            double max_seconds) {
  Row row{name};
  row.flops = w.flops;
  for (int i = 0; i < warmup; ++i) w.step();
  std::string skip = peer ? peer->Setup(name) : "no peer";
  bool with_peer = skip.empty();
  if (!with_peer) row.note = "peer: " + skip;
  std::vector<double> tk, tp, faults;
  // Each round starts with one untimed step on each side: the first step after the other side
  // ran (cold caches, sleeping threads) is not the steady state either side is measured in.
  auto kiln_round = [&] {
    w.step();
    for (int i = 0; i < reps; ++i) {
      const int64_t f0 = PageFaults();
      double t0 = Seconds();
      w.step();
      tk.push_back((Seconds() - t0) * 1e3);
      faults.push_back(static_cast<double>(PageFaults() - f0));
    }
  };
  // OpenBLAS's worker threads spin for a long time after each call (THREAD_TIMEOUT, 2^28 cycles
  // by default), which would steal the cores from whichever side runs next: a pause after each
  // side's round lets them go to sleep, so neither side pays for the other.
  auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(300)); };
  auto peer_round = [&] {
    std::vector<double> t = peer->Run(name, reps + 1);
    if (!t.empty()) t.erase(t.begin());
    tp.insert(tp.end(), t.begin(), t.end());
    settle();
  };
  // Under a time cap (a loaded machine), stop after the round that crosses it, but never before
  // two rounds (one in each order).
  double start = Seconds();
  for (int r = 0; r < rounds; ++r) {
    if (r >= 2 && Seconds() - start > max_seconds) break;
    ++row.rounds;
    if (r % 2 == 0 || !with_peer) {
      kiln_round();
      if (with_peer) {
        settle();
        peer_round();
      }
    } else {
      peer_round();
      kiln_round();
      settle();
    }
  }
  row.kiln_ms = Median(tk);
  row.kiln_faults = Median(faults);
  if (!faults.empty()) row.kiln_faults_max = *std::ranges::max_element(faults);
  row.peer_ms = with_peer ? Median(tp) : 0;
  if (!tk.empty())
    std::tie(row.kiln_lo, row.kiln_hi) =
        std::pair(*std::ranges::min_element(tk), *std::ranges::max_element(tk));
  if (with_peer && !tp.empty())
    std::tie(row.peer_lo, row.peer_hi) =
        std::pair(*std::ranges::min_element(tp), *std::ranges::max_element(tp));
  return row;
}

std::string JsonNumber(double v, bool present) {
  if (!present) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.4f", v);
  return buf;
}

std::string JsonEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o.push_back('\\');
    if (static_cast<unsigned char>(c) >= 0x20) o.push_back(c);
  }
  return o;
}

// The command line.
struct Flags {
  int threads = 2, rounds = 5, gpt2_rounds = 3;
  double max_seconds = 20;
  std::string peer_script = "bench/peer_torch.py", out_path = "bench/out/results.json";
  std::string peer_coretype = "auto";
  bool use_peer = true, profile = false, gpt2 = true, gpt2_scale = false;
  std::string only;
  std::string blas_dir;
};

// False (after printing the usage) on an unknown flag.
bool ParseFlags(int argc, char** argv, Flags* flags) {
  Flags& f = *flags;
  // Debian's OpenBLAS (libopenblas0-pthread) when installed; --peer-blas-dir overrides.
  f.blas_dir = "/usr/lib/x86_64-linux-gnu/openblas-pthread";
  if (!std::filesystem::exists(f.blas_dir + "/libblas.so.3")) f.blas_dir.clear();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--threads=", 0) == 0)
      f.threads = std::max(1, std::atoi(a.c_str() + 10));
    else if (a.rfind("--rounds=", 0) == 0)
      f.rounds = std::max(1, std::atoi(a.c_str() + 9));
    else if (a.rfind("--peer=", 0) == 0)
      f.peer_script = a.substr(7);
    else if (a.rfind("--max-seconds=", 0) == 0)
      f.max_seconds = std::atof(a.c_str() + 14);
    else if (a.rfind("--peer-blas-dir=", 0) == 0)
      f.blas_dir = a.substr(16);
    else if (a.rfind("--peer-coretype=", 0) == 0)
      f.peer_coretype = a.substr(16);
    else if (a == "--no-peer")
      f.use_peer = false;
    else if (a == "--profile")
      f.profile = true;
    else if (a.rfind("--gpt2-rounds=", 0) == 0)
      f.gpt2_rounds = std::max(1, std::atoi(a.c_str() + 14));
    else if (a == "--no-gpt2")
      f.gpt2 = false;
    else if (a == "--gpt2-scale")
      f.gpt2_scale = true;
    else if (a.rfind("--only=", 0) == 0)
      f.only = a.substr(7);
    else if (a.rfind("--out=", 0) == 0)
      f.out_path = a.substr(6);
    else {
      std::fprintf(stderr,
                   "usage: %s [--threads=2] [--rounds=5] [--max-seconds=20] "
                   "[--peer=bench/peer_torch.py] [--peer-blas-dir=DIR] "
                   "[--peer-coretype=auto|NAME] [--no-peer] "
                   "[--out=bench/out/results.json] [--only=SUBSTRING] [--profile] "
                   "[--gpt2-rounds=3] [--no-gpt2] [--gpt2-scale]\n",
                   argv[0]);
      return false;
    }
  }
  return true;
}

// The bare oneDNN matmul rates (FLOP/s), f32 and bf16; where oneDNN has no bf16 kernels (below
// avx512_core) bf16 is 0 and bf16_computes_in_f32 says the compiler computes bf16 in f32 there.
absl::StatusOr<runtime::MatmulRates> MatmulRates() { return runtime::MeasureMatmulRates(1024, 20); }

// "812.3 GFLOP/s", or "none (<why>: bf16 computes in f32 here)".
std::string Bf16RateText(const runtime::MatmulRates& r) {
  if (r.bf16_computes_in_f32) return "none (" + r.bf16_note + ": bf16 computes in f32 here)";
  return absl::StrFormat("%.1f GFLOP/s", r.bf16 * 1e-9);
}

// memcpy bandwidth on as many threads as OpenMP uses (bytes read + written per second, the median
// of 7 copies of 64 MiB: base/memory.h).
double MemcpyRate() { return MemcpyBytesPerSecond(omp_get_max_threads(), 7); }

// As the peer does (peer_torch.py): returns freed heap to the OS, resets the kernel's peak-RSS
// counter and returns the resident set now (-1 when the peak cannot be reset).
int64_t ResetPeakRss() {
  malloc_trim(0);
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.close();
  return clear ? ProcStatusBytes("VmRSS") : -1;
}

// One benchmark's compile times and memory (its step closure is not run again).
struct Memory {
  std::string name;
  Workload w;
  std::string peer_rss;  // the peer's "rss ..." reply
};

// The run: its flags, the peer, the matmul rates and what has been measured so far.
struct Bench {
  Flags flags;
  bench::CpuInfo cpu_info;
  std::string isa;
  std::unique_ptr<Peer> peer;
  PeerBlas peer_blas;
  double mm_f32 = 0, mm_bf16 = 0;
  // No bf16 matmul here (runtime::MatmulRates): the bf16 rows compute in f32, so their physical
  // limit is the f32 rate.
  bool bf16_in_f32 = false;
  std::string bf16_note;
  std::vector<Row> rows;
  std::vector<std::pair<std::string, double>> compile_times;
  std::vector<Memory> memory;
  double memcpy_rate = 0;     // bytes/s, at the start when the GPT-2 train row runs
  int64_t rss_baseline = -1;  // set by StartMemory, taken by the next Add

  bool Selected(const std::string& name) const {
    return flags.only.empty() || name.find(flags.only) != std::string::npos;
  }
  // The bare rate a row's FLOP/s is a share of.
  double Rate(bool bf16) const { return bf16 && !bf16_in_f32 ? mm_bf16 : mm_f32; }
  // Before building a workload: its row will report this process's peak RSS growth.
  void StartMemory() { rss_baseline = ResetPeakRss(); }
  // Runs one workload against the peer and records its row, compile time and memory. `bf16`: a
  // bf16 row (shares of Rate(true)). `rounds` 0: flags.rounds, under flags.max_seconds; else
  // exactly that many.
  void Add(const std::string& name, absl::StatusOr<Workload> w, int reps, int warmup, bool bf16,
           int rounds = 0);
};

void Bench::Add(const std::string& name, absl::StatusOr<Workload> w, int reps, int warmup,
                bool bf16, int rounds) {
  if (!Selected(name)) return;
  const int64_t baseline = rss_baseline;
  rss_baseline = -1;
  if (!w.ok()) {
    std::printf("%-22s kiln failed: %s\n", name.c_str(), std::string(w.status().message()).c_str());
    rows.push_back({name, 0, 0, 0, "kiln: " + std::string(w.status().message())});
    return;
  }
  compile_times.push_back({name, w->compile_s});
  memory.push_back({name, *w, ""});
  memory.back().w.step = nullptr;  // keep the numbers, not the executable
  memory.back().w.exe = nullptr;
  Row r = RunPair(name, *w, peer.get(), rounds > 0 ? rounds : flags.rounds, reps, warmup,
                  rounds > 0 ? 1e30 : flags.max_seconds);
  r.bf16 = bf16;
  r.min_bytes = w->min_bytes;
  rows.push_back(r);
  if (baseline >= 0) memory.back().w.rss_delta = ProcStatusBytes("VmHWM") - baseline;
  if (r.peer_ms > 0) memory.back().peer_rss = peer->Command("rss " + name);
  if (flags.profile) PrintProfile(name, *w, reps);
  std::printf(
      "%-22s kiln %9.3f ms [%.3f-%.3f]  peer %9s ms [%.3f-%.3f]  ratio %6s  rounds %d  %.1f "
      "GFLOP/s  kiln page faults/step %.0f (most %.0f) %s\n",
      r.name.c_str(), r.kiln_ms, r.kiln_lo, r.kiln_hi,
      r.peer_ms > 0 ? JsonNumber(r.peer_ms, true).c_str() : "-", r.peer_lo, r.peer_hi,
      RatioText(r.kiln_ms, r.peer_ms).c_str(), r.rounds, r.flops / (r.kiln_ms * 1e-3) * 1e-9,
      r.kiln_faults, r.kiln_faults_max, r.note.c_str());
  std::fflush(stdout);
}

// The machine, the peer and the matmul rates at the start, with the warnings that qualify every
// number after them.
absl::Status StartAndReport(Bench& b) {
  const Flags& f = b.flags;
  omp_set_num_threads(f.threads);
  // Under KILN_CPU_ISA the peer sees a CPU of that level (bench/cpu_isa_env.h): so does its
  // OpenBLAS core choice.
  b.cpu_info = bench::ReadCpuInfo();
  if (CpuIsaCapped()) b.cpu_info = bench::CapCpuInfo(b.cpu_info, CpuIsaName(ActiveCpuIsa()));
  b.isa = runtime::OneDnnIsaName();
  std::printf("cpu: %s; oneDNN ISA %s; flags: %s\n", b.cpu_info.model.c_str(), b.isa.c_str(),
              bench::SimdFlags(b.cpu_info).c_str());
  if (f.use_peer) {
    b.peer = StartTunedPeer(f.peer_script, f.threads, f.blas_dir, f.peer_coretype, b.cpu_info,
                            &b.peer_blas);
    if (!b.peer) std::fprintf(stderr, "running without the peer\n");
  }
  Peer* peer = b.peer.get();
  std::printf("train_bench: %d threads, %d alternating rounds; peer: %s\n", f.threads, f.rounds,
              peer ? ("PyTorch " + peer->version()).c_str() : "none");
  if (peer && peer->version().find("/blas/libblas.so") != std::string::npos) {
    std::printf(
        "WARNING: the peer's float32 matmuls run on Debian's reference BLAS (netlib "
        "libblas.so.3),\n"
        "         not OpenBLAS: its f32 numbers are NOT a tuned baseline. Install\n"
        "         libopenblas0-pthread (found automatically) or pass --peer-blas-dir=DIR.\n");
  }

  // The bare oneDNN rate, measured now and again after the models; the higher of the two is the
  // physical limit the models' shares are taken of (a load spike only lowers a measurement).
  KILN_ASSIGN_OR_RETURN(runtime::MatmulRates rates, MatmulRates());
  b.mm_f32 = rates.f32;
  b.mm_bf16 = rates.bf16;
  b.bf16_in_f32 = rates.bf16_computes_in_f32;
  b.bf16_note = rates.bf16_note;
  const double mm_f32 = b.mm_f32, mm_bf16 = b.mm_bf16;
  const PeerBlas& peer_blas = b.peer_blas;
  std::printf("bare oneDNN matmul 1024^3 (start): f32 %.1f GFLOP/s, bf16 %s\n", mm_f32 * 1e-9,
              Bf16RateText(rates).c_str());
  // The GPT-2 train row's roofline floor also needs the memcpy rate (ReportRoofline).
  const bool gpt2_train_rows =
      b.Selected("gpt2_small_train") ||
      (f.gpt2_scale && (b.Selected("gpt2_medium_train") || b.Selected("gpt2_small_seq512_train")));
  if (f.gpt2 && gpt2_train_rows) b.memcpy_rate = MemcpyRate();
  if (peer) {
    std::printf(
        "peer matmul 1024^3 f32: %.1f GFLOP/s on OpenBLAS core %s%s (%.0f%% of oneDNN's)\n",
        peer_blas.matmul.gflops, peer_blas.core.c_str(),
        peer_blas.coretype.empty() ? "" : (" via OPENBLAS_CORETYPE=" + peer_blas.coretype).c_str(),
        100 * peer_blas.matmul.gflops / (mm_f32 * 1e-9));
    if (peer_blas.matmul.gflops < 0.5 * mm_f32 * 1e-9) {
      g_peer_comparable = false;
      std::printf(
          "\n"
          "WARNING: THE PEER IS NOT A TUNED BASELINE. Its f32 matmul runs at %.1f GFLOP/s, under\n"
          "         half of oneDNN's %.1f on the same threads (OpenBLAS core %s). Every Kiln/peer\n"
          "         ratio below is marked n/c (not comparable) and written as null.\n\n",
          peer_blas.matmul.gflops, mm_f32 * 1e-9, peer_blas.core.c_str());
    }
  }
  // What mixed_bf16 buys here (docs/compiler.md): bf16 halves activation and weight bytes; it is
  // faster only where oneDNN's bf16 kernels outrun its f32 ones (AMX; not avx512_core_bf16 alone),
  // and below avx512_core there are none: the compiler computes bf16 in f32 (float-normalization).
  if (b.bf16_in_f32) {
    std::printf(
        "mixed_bf16 on this CPU (oneDNN ISA %s): %s, so the compiler computes bf16 matmuls and "
        "convolutions in f32 (bf16 storage): bf16 buys no speed here; the bf16 rows' shares are "
        "of the f32 rate\n",
        b.isa.c_str(), b.bf16_note.c_str());
  } else {
    std::printf(
        "mixed_bf16 on this CPU (oneDNN ISA %s): bf16 matmul %.0f / f32 %.0f GFLOP/s = "
        "%.2fx: %s\n",
        b.isa.c_str(), mm_bf16 * 1e-9, mm_f32 * 1e-9, mm_bf16 / mm_f32,
        mm_bf16 >= mm_f32 ? "bf16 compute is faster; mixed_bf16 buys speed and memory"
                          : "bf16 compute is slower; mixed_bf16 buys memory, not speed");
  }
  return absl::OkStatus();
}

// A bf16 train step the compiler cannot build yet is reported and skipped, not a failed row.
bool SkipUnsupportedBf16(const std::string& name, DType dt, const absl::StatusOr<Workload>& w) {
  if (dt != DType::kBF16 || w.ok()) return false;
  std::printf("%-22s bf16: not yet (%s)\n", name.c_str(),
              std::string(w.status().message()).substr(0, 160).c_str());
  return true;
}

// MLP and encoder-layer training steps, f32 and bf16.
void RunTrainRows(Bench& b, runtime::Backend& cpu) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    nn::MlpClassifier mlp({.in_features = kMlpWidth,
                           .hidden = kMlpHidden,
                           .num_classes = 10,
                           .activation = nn::Activation::kRelu,
                           .dtype = dt});
    std::string name = std::string("mlp_train_") + std::string(DTypeName(dt));
    if (!b.Selected(name)) continue;
    absl::StatusOr<ir::Graph> loss = mlp.LossGraph(256);
    absl::StatusOr<Workload> w =
        loss.ok()
            ? TrainWorkload(cpu, *loss, mlp.Params(),
                            {RandomTensor(dt, Shape{256, kMlpWidth}, 5), RandomLabels(256, 10, 6)},
                            3 * MlpForwardFlops(256))
            : absl::StatusOr<Workload>(loss.status());
    if (SkipUnsupportedBf16(name, dt, w)) continue;
    b.Add(name, std::move(w), 4, 3, dt == DType::kBF16);
  }
  for (DType dt : {DType::kF32, DType::kBF16}) {
    nn::TransformerBlock block = EncoderBlock(dt);
    std::string name = std::string("encoder_train_") + std::string(DTypeName(dt));
    if (!b.Selected(name)) continue;
    absl::StatusOr<ir::Graph> loss = EncoderGraph(kEncBatch, /*loss=*/true, dt);
    absl::StatusOr<Workload> w =
        loss.ok() ? TrainWorkload(cpu, *loss, block.Params(),
                                  {RandomTensor(dt, Shape{kEncBatch, kSeq, kD}, 7),
                                   RandomTensor(dt, Shape{kEncBatch, kSeq, kD}, 8)},
                                  3 * EncoderForwardFlops(kEncBatch))
                  : absl::StatusOr<Workload>(loss.status());
    if (SkipUnsupportedBf16(name, dt, w)) continue;
    b.Add(name, std::move(w), 2, 2, dt == DType::kBF16);
  }
}

// Inference at batch 1 and 256.
void RunInferRows(Bench& b, runtime::Backend& cpu) {
  for (int64_t batch : {int64_t{1}, int64_t{256}}) {
    if (!b.Selected("mlp_infer_b" + std::to_string(batch))) continue;
    nn::MlpClassifier mlp({.in_features = kMlpWidth, .hidden = kMlpHidden, .num_classes = 10});
    absl::StatusOr<ir::Graph> g = MlpForwardGraph(mlp, batch);
    absl::StatusOr<Workload> w =
        g.ok() ? InferWorkload(cpu, *g, mlp.Params(),
                               {RandomTensor(DType::kF32, Shape{batch, kMlpWidth}, 9)},
                               MlpForwardFlops(batch))
               : absl::StatusOr<Workload>(g.status());
    b.Add("mlp_infer_b" + std::to_string(batch), std::move(w), batch == 1 ? 50 : 24, 5, false);
  }
  for (int64_t batch : {int64_t{1}, int64_t{256}}) {
    if (!b.Selected("encoder_infer_b" + std::to_string(batch))) continue;
    nn::TransformerBlock block = EncoderBlock();
    absl::StatusOr<ir::Graph> g = EncoderGraph(batch, /*loss=*/false);
    absl::StatusOr<Workload> w =
        g.ok() ? InferWorkload(cpu, *g, block.Params(),
                               {RandomTensor(DType::kF32, Shape{batch, kSeq, kD}, 10)},
                               EncoderForwardFlops(batch))
               : absl::StatusOr<Workload>(g.status());
    b.Add("encoder_infer_b" + std::to_string(batch), std::move(w), batch == 1 ? 20 : 1, 1, false);
  }
}

// "logits" [batch, seq, vocab] of `gpt` (no argmax: the peer computes the logits alone).
absl::StatusOr<ir::Graph> GptLogitsGraph(const nn::Gpt& gpt, int64_t batch) {
  KILN_RETURN_IF_ERROR(gpt.Validate());
  ir::Builder b("gpt_logits");
  nn::ParamValues p = nn::AddParameters(b, gpt.Params());
  ir::Value tokens = b.Parameter("tokens", DType::kS32, Shape{batch, gpt.seq_len()});
  b.Output("logits", gpt.Logits(p, tokens, nn::RngInputs{}));
  return b.Build();
}

// GPT-2 small: the train step (AdamW, clip 1.0, batch 4) and the logits at batch 1 and 8, for
// --gpt2-rounds rounds each (the header comment).
// One GPT train-step row (AdamW, clip 1.0, batch kGptTrainBatch) of `config`.
void RunGptTrainRow(Bench& b, runtime::Backend& cpu, const std::string& name,
                    const nn::GptConfig& config) {
  if (!b.Selected(name)) return;
  // A fresh peer process per GPT train row: the heap an earlier row freed stays resident in the
  // peer (glibc keeps it), and a later row reusing it would show less peak-RSS growth than its
  // model needs (GPT-2 medium measured below its own parameters + gradients + AdamW state).
  if (b.peer) {
    std::unique_ptr<Peer> fresh =
        Peer::Start(b.flags.peer_script, b.flags.threads, b.flags.blas_dir, b.peer_blas.coretype);
    if (fresh) b.peer = std::move(fresh);
  }
  b.StartMemory();
  const nn::Gpt gpt(config);
  const nn::GptConfig& c = gpt.config();
  int64_t num_params = 0;
  for (const nn::ParamSpec& spec : gpt.Params()) num_params += spec.shape.num_elements();
  nn::OptimizerConfig opt = AdamW();
  opt.clip_norm = 1.0;
  absl::StatusOr<ir::Graph> loss = gpt.LossGraph(kGptTrainBatch);
  absl::StatusOr<Workload> w =
      loss.ok() ? TrainWorkload(cpu, *loss, gpt.Params(),
                                {RandomTokens(kGptTrainBatch, c.seq_len, c.vocab_size, 11),
                                 RandomTokens(kGptTrainBatch, c.seq_len, c.vocab_size, 12)},
                                3 * GptForwardFlops(c, kGptTrainBatch), opt,
                                /*measure_hits=*/false)
                : absl::StatusOr<Workload>(loss.status());
  if (w.ok()) w->min_bytes = AdamWClipBytes(num_params);
  b.Add(name, std::move(w), /*reps=*/2, /*warmup=*/1, false, b.flags.gpt2_rounds);
}

void RunGpt2Rows(Bench& b, runtime::Backend& cpu) {
  if (!b.flags.gpt2) return;
  const nn::Gpt gpt(Gpt2Small());
  const nn::GptConfig& c = gpt.config();
  const int rounds = b.flags.gpt2_rounds;
  RunGptTrainRow(b, cpu, "gpt2_small_train", Gpt2Small());
  if (b.flags.gpt2_scale) {
    RunGptTrainRow(b, cpu, "gpt2_medium_train", Gpt2Medium());
    nn::GptConfig long_seq = Gpt2Small();
    long_seq.seq_len = 512;
    RunGptTrainRow(b, cpu, "gpt2_small_seq512_train", long_seq);
  }
  for (int64_t batch : {int64_t{1}, int64_t{8}}) {
    const std::string name = "gpt2_small_infer_b" + std::to_string(batch);
    if (!b.Selected(name)) continue;
    b.StartMemory();
    absl::StatusOr<ir::Graph> g = GptLogitsGraph(gpt, batch);
    absl::StatusOr<Workload> w =
        g.ok()
            ? InferWorkload(cpu, *g, gpt.Params(), {RandomTokens(batch, kGptSeq, c.vocab_size, 13)},
                            GptForwardFlops(c, batch))
            : absl::StatusOr<Workload>(g.status());
    b.Add(name, std::move(w), batch == 1 ? 5 : 3, 1, false, rounds);
  }
}

// Dispatch overhead: a graph of many tiny ops. The default backend fuses the chain into a few
// loop kernels; the prefer_loops backend (no fusion) runs one thunk per op, which is what the
// per-thunk figure measures.
void RunDispatchRows(Bench& b, runtime::Backend& cpu) {
  if (!b.Selected("dispatch")) return;
  constexpr int kOps = 2000;
  const int rounds = b.flags.rounds;
  const double max_seconds = b.flags.max_seconds;
  absl::StatusOr<Workload> w = DispatchWorkload(cpu, kOps);
  std::unique_ptr<runtime::Backend> loops_backend = runtime::MakeCpuBackend({.prefer_loops = true});
  absl::StatusOr<Workload> wl = DispatchWorkload(*loops_backend, kOps);
  if (!w.ok() || !wl.ok()) {
    std::printf("dispatch failed: %s\n",
                std::string((w.ok() ? wl.status() : w.status()).message()).c_str());
    return;
  }
  Row r = RunPair("dispatch_2000_tiny_ops", *w, b.peer.get(), rounds, 20, 20, max_seconds);
  Row rl = RunPair("dispatch_loops", *wl, nullptr, rounds, 20, 20, max_seconds);
  double per_thunk = rl.kiln_ms * 1e3 / std::max(1, wl->thunks);
  std::printf(
      "%-22s kiln %9.3f ms  peer %9s ms  ratio %6s  (kiln: %d ops in %d fused thunks, %.4f "
      "us/op; one thunk per op: %.4f us/thunk over %d thunks%s)\n",
      r.name.c_str(), r.kiln_ms, r.peer_ms > 0 ? JsonNumber(r.peer_ms, true).c_str() : "-",
      RatioText(r.kiln_ms, r.peer_ms).c_str(), kOps, w->thunks, r.kiln_ms * 1e3 / kOps, per_thunk,
      wl->thunks,
      r.peer_ms > 0 ? ("; peer " + JsonNumber(r.peer_ms * 1e3 / kOps, true) + " us/op").c_str()
                    : "");
  char buf[160];
  std::snprintf(buf, sizeof(buf),
                "kiln %d fused thunks, %.4f us/op; one thunk per op: %.4f us/thunk", w->thunks,
                r.kiln_ms * 1e3 / kOps, per_thunk);
  r.note = r.note.empty() ? buf : r.note + "; " + buf;
  b.rows.push_back(r);
  b.rows.push_back({"dispatch_us_per_thunk", per_thunk, 0, 0, "us per thunk, not ms"});
}

// Shares of the bare matmul rate (measured again now; the higher of the two counts).
absl::Status ReportShares(Bench& b) {
  KILN_ASSIGN_OR_RETURN(runtime::MatmulRates end, MatmulRates());
  std::printf("bare oneDNN matmul 1024^3 (end):   f32 %.1f GFLOP/s, bf16 %s\n", end.f32 * 1e-9,
              Bf16RateText(end).c_str());
  b.mm_f32 = std::max(b.mm_f32, end.f32);
  b.mm_bf16 = std::max(b.mm_bf16, end.bf16);
  const std::string bf16_rate = b.bf16_in_f32 ? "none: bf16 rows against the f32 rate"
                                              : absl::StrFormat("%.0f GFLOP/s", b.mm_bf16 * 1e-9);
  std::printf("model FLOP/s as a share of the best bare oneDNN rate (f32 %.0f GFLOP/s, bf16 %s):\n",
              b.mm_f32 * 1e-9, bf16_rate.c_str());
  for (Row& r : b.rows) {
    if (r.flops <= 0 || r.kiln_ms <= 0) continue;
    const double rate = b.Rate(r.bf16);
    double kiln = r.flops / (r.kiln_ms * 1e-3) / rate;
    double peer = r.peer_ms > 0 ? r.flops / (r.peer_ms * 1e-3) / rate : 0;
    char buf[96];
    std::snprintf(buf, sizeof(buf), "kiln %.0f%% of oneDNN rate", 100 * kiln);
    std::string peer_part =
        peer > 0 ? ", peer " + std::to_string(static_cast<int>(100 * peer + 0.5)) + "%" : "";
    std::printf("  %-22s %s%s\n", r.name.c_str(), buf, peer_part.c_str());
    r.note = r.note.empty() ? buf + peer_part : r.note + "; " + buf + peer_part;
  }
  return absl::OkStatus();
}

// What bf16 buys on this CPU: each bf16 train row's step time against its f32 twin's, measured in
// this run (nothing, or a loss, is a finding too: below avx512_core bf16 computes in f32).
void ReportBf16(Bench& b) {
  bool header = false;
  for (Row& r : b.rows) {
    const size_t at = r.name.rfind("_bf16");
    if (at == std::string::npos || at + 5 != r.name.size() || r.kiln_ms <= 0) continue;
    const std::string twin = r.name.substr(0, at) + "_f32";
    auto f32 = std::find_if(b.rows.begin(), b.rows.end(),
                            [&](const Row& o) { return o.name == twin && o.kiln_ms > 0; });
    if (f32 == b.rows.end()) continue;
    if (!header) {
      std::printf("bf16 on this CPU (oneDNN ISA %s%s), step time against f32:\n", b.isa.c_str(),
                  b.bf16_in_f32 ? ": no bf16 kernels, bf16 computes in f32" : "");
      header = true;
    }
    const double ratio = r.kiln_ms / f32->kiln_ms;
    char buf[128];
    std::snprintf(buf, sizeof(buf), "bf16 %.3f ms vs f32 %.3f ms: x%.2f the time (%s)", r.kiln_ms,
                  f32->kiln_ms, ratio,
                  ratio < 0.97   ? "bf16 is faster"
                  : ratio > 1.03 ? "bf16 is slower"
                                 : "no gain");
    std::printf("  %-22s %s\n", r.name.c_str(), buf);
    r.note = r.note.empty() ? buf : r.note + "; " + buf;
  }
}

// The roofline floor of the rows that have one (Row::min_bytes): FLOPs at the best bare oneDNN
// rate plus min_bytes at the memcpy rate (the higher of the start's and now's), and each side's
// time as a multiple of it.
void ReportRoofline(Bench& b) {
  std::vector<Row> floors;
  for (const Row& r : b.rows) {
    if (r.min_bytes <= 0 || r.kiln_ms <= 0) continue;
    if (floors.empty()) {
      const double end = MemcpyRate();
      std::printf("memcpy 64 MiB (end): %.1f GB/s read + written (start %.1f); the higher counts\n",
                  end * 1e-9, b.memcpy_rate * 1e-9);
      b.memcpy_rate = std::max(b.memcpy_rate, end);
    }
    const double rate = b.Rate(r.bf16);
    const double floor_ms = (r.flops / rate + r.min_bytes / b.memcpy_rate) * 1e3;
    char note[256];
    std::snprintf(
        note, sizeof(note),
        "roofline floor %.1f ms = %.1f GFLOP at %.0f GFLOP/s + %.2f GB at %.1f GB/s "
        "memcpy; kiln x%.3f of it%s",
        floor_ms, r.flops * 1e-9, rate * 1e-9, r.min_bytes * 1e-9, b.memcpy_rate * 1e-9,
        r.kiln_ms / floor_ms,
        r.peer_ms > 0 ? absl::StrFormat(", peer x%.3f", r.peer_ms / floor_ms).c_str() : "");
    // A step faster than its floor means the bare rates were measured under other load.
    const char* caveat = r.kiln_ms < floor_ms
                             ? " (a step below its floor: the bare rates were measured under "
                               "other load, so this floor is no bound)"
                             : "";
    std::printf("  %-22s %s%s\n", r.name.c_str(), note, caveat);
    floors.push_back({"roofline_floor_" + r.name, floor_ms, 0, 0, std::string("ms; ") + note});
    floors.push_back({"roofline_multiple_" + r.name, r.kiln_ms / floor_ms,
                      r.peer_ms > 0 ? r.peer_ms / floor_ms : 0, 0,
                      "step time / roofline floor, not ms"});
  }
  b.rows.insert(b.rows.end(), floors.begin(), floors.end());
  if (b.memcpy_rate > 0) {
    b.rows.push_back({"memcpy_gbps", b.memcpy_rate * 1e-9, 0, 0, "GB/s read + written, not ms"});
  }
}

// Cold compile times and compile-cache hits.
void ReportCompileTimes(Bench& b) {
  // Cold: the first compile of each graph in this process (no compile cache yet), optimize +
  // lower + the arena allocation, whose zeroing pays the page faults of fresh memory.
  std::printf("cold compile (optimize + lower + arena first touch):");
  for (auto& [name, s] : b.compile_times) {
    std::printf(" %s %.0f ms;", name.c_str(), s * 1e3);
    b.rows.push_back({"compile_cold_" + name, s * 1e3, 0, 0, "kiln only"});
  }
  std::printf("\n");
  // Compile cache hits: the same train step compiled again in this process. The backend compile
  // alone (the cold number above also builds the step graph and allocates parameters and state).
  std::printf("compile, backend only: cold / cache hit / cache hit into recycled memory:\n");
  for (const Memory& m : b.memory) {
    if (m.w.compile_hit_s <= 0) continue;
    std::printf("  %-22s %7.1f ms / %6.1f ms / %6.1f ms%s\n", m.name.c_str(),
                m.w.compile_backend_s * 1e3, m.w.compile_hit_s * 1e3,
                m.w.compile_hit_recycled_s * 1e3,
                m.w.compile_hit_s <= 0.050 ? "" : "  (target 50 ms: arena first touch dominates)");
    char note[160];
    std::snprintf(note, sizeof(note),
                  "kiln only; backend compile %.1f ms cold; %.1f ms on a hit into recycled memory",
                  m.w.compile_backend_s * 1e3, m.w.compile_hit_recycled_s * 1e3);
    b.rows.push_back({"compile_hit_" + m.name, m.w.compile_hit_s * 1e3, 0, 0, note});
  }
}

// Memory per step: Kiln's planned arena (every activation and temporary of one step; the
// parameters and optimizer state live outside it) against the growth of the peer's peak resident
// set over its baseline while it set up and ran the same benchmark (peer_torch.py, "rss"). Rows
// that measured it (Bench::StartMemory) also give Kiln's own peak RSS growth, like for like.
void ReportMemory(Bench& b) {
  std::printf(
      "memory per training step: Kiln arena (lower bound) + resident params/state; "
      "peer peak RSS increase:\n");
  for (const Memory& m : b.memory) {
    double peer_mib = 0;
    std::istringstream in(m.peer_rss);
    std::string word;
    long long delta = 0;
    bool have_peer = (in >> word) && word == "rss" && (in >> delta);
    if (have_peer) peer_mib = delta / 1048576.0;
    char peer_text[96];
    std::snprintf(peer_text, sizeof(peer_text), "%.1f MiB", peer_mib);
    const std::string peer_part =
        have_peer ? peer_text : (m.peer_rss.empty() ? "not run" : m.peer_rss.c_str());
    const double kiln_rss = m.w.rss_delta / 1048576.0;
    const std::string rss_part =
        m.w.rss_delta >= 0 ? absl::StrFormat("; kiln peak RSS +%.1f MiB", kiln_rss) : "";
    if (m.w.rss_delta >= 0) {
      b.rows.push_back({"rss_" + m.name, kiln_rss, have_peer ? peer_mib : 0, 0,
                        "MiB, not ms: peak resident-set growth over the row, kiln process vs "
                        "peer process"});
    }
    if (!m.w.train) {
      std::printf("  %-22s arena %.1f MiB%s%s\n", m.name.c_str(), m.w.arena_bytes / 1048576.0,
                  rss_part.c_str(), m.w.rss_delta >= 0 ? ("; peer +" + peer_part).c_str() : "");
      continue;
    }
    double arena = m.w.arena_bytes / 1048576.0, bound = m.w.lower_bound_bytes / 1048576.0;
    double state = m.w.state_bytes / 1048576.0;
    std::printf(
        "  %-22s arena %7.1f MiB (lower bound %7.1f, x%.3f) + %6.1f MiB params/state%s; "
        "peer +%s\n",
        m.name.c_str(), arena, bound, bound > 0 ? arena / bound : 0.0, state, rss_part.c_str(),
        peer_part.c_str());
    char note[200];
    std::snprintf(note, sizeof(note),
                  "MiB, not ms: kiln arena (lower bound %.1f MiB; params+state %.1f MiB outside "
                  "it) vs peer peak RSS increase",
                  bound, state);
    b.rows.push_back({"memory_" + m.name, arena, have_peer ? peer_mib : 0, 0, note});
  }
}

// "kiln_range_ms": [lo, hi], "peer_range_ms": [lo, hi], (each only when timed).
std::string RangesJson(const Row& r) {
  std::string out;
  if (r.kiln_hi > 0)
    out += absl::StrFormat("\"kiln_range_ms\": [%.4f, %.4f], ", r.kiln_lo, r.kiln_hi);
  if (r.peer_hi > 0)
    out += absl::StrFormat("\"peer_range_ms\": [%.4f, %.4f], ", r.peer_lo, r.peer_hi);
  return out;
}

// results.json. False when it cannot be written.
bool WriteResults(const Bench& b) {
  const std::string& out_path = b.flags.out_path;
  const Peer* peer = b.peer.get();
  const PeerBlas& peer_blas = b.peer_blas;
  std::filesystem::path out(out_path);
  if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path());
  FILE* f = std::fopen(out_path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", out_path.c_str());
    return false;
  }
  std::fprintf(f,
               "{\n  \"threads\": %d,\n  \"rounds\": %d,\n  \"gpt2_rounds\": %d,\n  "
               "\"peer\": \"%s\",\n",
               b.flags.threads, b.flags.rounds, b.flags.gpt2_rounds,
               peer ? JsonEscape("torch " + peer->version()).c_str() : "");
  std::fprintf(f, "  \"cpu\": {\"model\": \"%s\", \"flags\": \"%s\", \"onednn_isa\": \"%s\"},\n",
               JsonEscape(b.cpu_info.model).c_str(),
               JsonEscape(bench::SimdFlags(b.cpu_info)).c_str(), JsonEscape(b.isa).c_str());
  std::fprintf(f,
               "  \"peer_blas\": {\"core\": \"%s\", \"default_core\": \"%s\", "
               "\"openblas_coretype\": \"%s\", \"matmul_1024_f32_gflops\": %s, "
               "\"default_core_matmul_1024_f32_gflops\": %s, \"matmul_max_rel_error\": %s, "
               "\"onednn_matmul_1024_f32_gflops\": %s, \"comparable\": %s, \"note\": \"%s\"},\n",
               JsonEscape(peer_blas.core).c_str(), JsonEscape(peer_blas.default_core).c_str(),
               JsonEscape(peer_blas.coretype).c_str(),
               JsonNumber(peer_blas.matmul.gflops, peer != nullptr).c_str(),
               JsonNumber(peer_blas.default_gflops, peer && peer_blas.default_gflops > 0).c_str(),
               peer ? absl::StrFormat("%.3g", peer_blas.matmul.max_error).c_str() : "null",
               JsonNumber(b.mm_f32 * 1e-9, true).c_str(),
               peer ? (g_peer_comparable ? "true" : "false") : "null",
               JsonEscape(peer_blas.note).c_str());
  std::fprintf(f, "  \"benchmarks\": [\n");
  for (size_t i = 0; i < b.rows.size(); ++i) {
    const Row& r = b.rows[i];
    bool pp = r.peer_ms > 0 && r.kiln_ms > 0;
    std::fprintf(f,
                 "    {\"name\": \"%s\", \"kiln_median_ms\": %s, \"peer_median_ms\": %s, "
                 "%s\"ratio\": %s, \"comparable\": %s, \"note\": \"%s\"}%s\n",
                 JsonEscape(r.name).c_str(), JsonNumber(r.kiln_ms, r.kiln_ms > 0).c_str(),
                 JsonNumber(r.peer_ms, r.peer_ms > 0).c_str(), RangesJson(r).c_str(),
                 JsonNumber(pp ? r.kiln_ms / r.peer_ms : 0, pp && g_peer_comparable).c_str(),
                 pp ? (g_peer_comparable ? "true" : "false") : "null", JsonEscape(r.note).c_str(),
                 i + 1 < b.rows.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  std::fclose(f);
  std::printf("wrote %s (ratio = kiln / peer; < 1 means Kiln is faster)\n", out_path.c_str());
  return true;
}

int Main(int argc, char** argv) {
  Bench b;
  if (!ParseFlags(argc, argv, &b.flags)) return 2;
  if (absl::Status s = StartAndReport(b); !s.ok()) {
    std::fprintf(stderr, "train_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  // The bench owns its compile cache (in memory only): the compile-hit rows measure it.
  compiler::CompileCacheOptions cache_options;
  cache_options.use_disk = false;
  cache_options.log = [](const std::string& m) {
    if (m.find("WARNING") != std::string::npos) std::fprintf(stderr, "%s\n", m.c_str());
  };
  compiler::CompileCache cache(std::move(cache_options));
  std::unique_ptr<runtime::Backend> cpu = runtime::MakeCpuBackend({.compile_cache = &cache});
  RunTrainRows(b, *cpu);
  RunInferRows(b, *cpu);
  RunDispatchRows(b, *cpu);
  RunGpt2Rows(b, *cpu);
  if (absl::Status s = ReportShares(b); !s.ok()) {
    std::fprintf(stderr, "train_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  ReportBf16(b);
  ReportRoofline(b);
  ReportCompileTimes(b);
  ReportMemory(b);
  b.rows.push_back({"onednn_matmul_1024_f32_gflops", b.mm_f32 * 1e-9, 0, 0, "GFLOP/s, not ms"});
  b.rows.push_back({"onednn_matmul_1024_bf16_gflops", b.mm_bf16 * 1e-9, 0, 0,
                    b.bf16_in_f32 ? "GFLOP/s, not ms; none: " + b.bf16_note : "GFLOP/s, not ms"});
  return WriteResults(b) ? 0 : 1;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  // KILN_CPU_ISA first: the level is decided before any kernel or oneDNN call.
  if (int rc = kiln::bench::ApplyCpuIsaEnvironment("train_bench"); rc != 0) return rc;
  // Our processes never return memory to the OS mid-run (page faults cost ~10 us on these VMs).
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);
  signal(SIGPIPE, SIG_IGN);
  return kiln::Main(argc, argv);
}
