#include "bench/serve_compute.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "bench/peer_kernels.h"
#include "bench/roofline.h"
#include "bench/timing.h"
#include "kiln/compiler/passes/quantize_int8.h"
#include "kiln/ir/parser.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/params.h"
#include "kiln/nn/vision.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/tensor/safetensors.h"

namespace kiln::bench {
namespace {

using nlohmann::json;

// The ONNX Runtime peer: `node peer.js` with JSON lines both ways.
class OrtPeer {
 public:
  static std::unique_ptr<OrtPeer> Start(const ComputeBenchOptions& o, std::string* why) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) {
      *why = "pipe failed";
      return nullptr;
    }
    pid_t pid = fork();
    if (pid < 0) {
      *why = "fork failed";
      return nullptr;
    }
    if (pid == 0) {
      dup2(to_child[0], 0);
      dup2(from_child[1], 1);
      close(to_child[1]);
      close(from_child[0]);
      execlp(o.node.c_str(), o.node.c_str(), o.peer.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    auto p = std::unique_ptr<OrtPeer>(new OrtPeer);
    p->pid_ = pid;
    p->in_ = fdopen(to_child[1], "w");
    p->out_ = fdopen(from_child[0], "r");
    return p;
  }
  ~OrtPeer() {
    if (in_) {
      std::fputs("{\"cmd\":\"quit\"}\n", in_);
      std::fclose(in_);
    }
    if (out_) std::fclose(out_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }
  // The reply, or {"ok": false, "error": ...} when the peer is gone.
  json Call(const json& cmd) {
    std::fputs((cmd.dump() + "\n").c_str(), in_);
    std::fflush(in_);
    std::string line;
    int c;
    while ((c = std::fgetc(out_)) != EOF && c != '\n') line.push_back(static_cast<char>(c));
    if (line.empty()) return {{"ok", false}, {"error", "the node peer exited"}};
    json r = json::parse(line, nullptr, false);
    if (r.is_discarded()) return {{"ok", false}, {"error", "bad reply: " + line}};
    return r;
  }

 private:
  OrtPeer() = default;
  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
};

Tensor RandomInput(Shape s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Tensor t(DType::kF32, std::move(s));
  for (int64_t i = 0; i < t.num_elements(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

bool WriteRaw(const std::string& path, const Tensor& t) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(t.raw_data()), t.byte_size());
  return static_cast<bool>(f);
}

std::vector<float> ReadRaw(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return {};
  std::vector<float> v(static_cast<size_t>(f.tellg()) / sizeof(float));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), v.size() * sizeof(float));
  return v;
}

// A compiled program with its arguments: weights bound constant (as kiln serve binds them), the
// runtime input "x" filled.
struct KilnRun {
  std::unique_ptr<runtime::Executable> exe;
  std::vector<Tensor> args, outs;
  std::vector<const Tensor*> in;
  std::vector<Tensor*> out;

  // `bind`: the weights bound constant, as kiln serve binds them (pre-packed); false: passed per
  // run like a training step's (the path every batch took before binding existed).
  absl::Status Prepare(runtime::Backend& backend, const ir::Graph& g,
                       const std::map<std::string, Tensor>& weights, const Tensor& x,
                       bool bind_weights = true) {
    auto compiled = backend.Compile(g);
    if (!compiled.ok()) return compiled.status();
    exe = std::move(*compiled);
    std::map<int, Tensor> bind;
    for (int id : exe->graph().parameters()) {
      const std::string name = exe->graph().node(id).attr_str("name");
      auto it = weights.find(name);
      if (it != weights.end()) {
        bind[static_cast<int>(args.size())] = it->second;
        args.push_back(it->second);
      } else if (name == "x") {
        args.push_back(x);
      } else {
        return absl::InvalidArgumentError("no value for parameter '" + name + "'");
      }
    }
    if (!bind_weights) bind.clear();
    absl::Status s = exe->BindConstantParameters(bind);
    if (!s.ok()) return s;
    for (const ir::Output& o : exe->graph().outputs()) {
      const ir::Type& t = exe->graph().node(o.node).type();
      outs.emplace_back(t.dtype, t.shape);
    }
    for (Tensor& t : args) in.push_back(&t);
    for (Tensor& t : outs) out.push_back(&t);
    return exe->RunInto(in, out);  // warm-up
  }

  // Per thunk (in run order): its name and mean microseconds per run over `runs` runs.
  json Profile(int runs) {
    std::vector<double> ns(exe->num_thunks(), 0.0);
    exe->set_thunk_observer(
        [&](int t, int64_t start, int64_t end) { ns[t] += static_cast<double>(end - start); });
    const double t0 = Seconds();
    for (int r = 0; r < runs; ++r) (void)exe->RunInto(in, out);
    const double total_us = (Seconds() - t0) * 1e6 / runs;
    exe->set_thunk_observer(nullptr);
    json kernels = json::array();
    for (int t = 0; t < exe->num_thunks(); ++t)
      kernels.push_back({{"name", exe->thunk(t).name()}, {"us", ns[t] / 1e3 / runs}});
    return {{"run_us", total_us}, {"kernels", kernels}};
  }

  // Microseconds per run, for `seconds` (at least 5 runs).
  std::vector<double> Time(double seconds) {
    std::vector<double> us;
    const double end = Seconds() + seconds;
    while (us.size() < 5 || Seconds() < end) {
      const double t0 = Seconds();
      (void)exe->RunInto(in, out);
      us.push_back((Seconds() - t0) * 1e6);
    }
    return us;
  }
};

struct ModelCase {
  std::string name;
  std::unique_ptr<nn::Model> model;
  json spec;  // for export_onnx.py
  int64_t features = 0;
};

std::vector<ModelCase> Models() {
  std::vector<ModelCase> m;
  {
    nn::MlpOptions o;
    o.in_features = 1024;
    o.hidden = {1024, 1024, 1024};
    o.num_classes = 10;
    ModelCase c;
    c.name = "mlp 1024-1024-1024-1024-10";
    c.model = std::make_unique<nn::MlpClassifier>(o);
    c.spec = {{"kind", "mlp"}, {"widths", {1024, 1024, 1024, 1024, 10}}};
    c.features = 1024;
    m.push_back(std::move(c));
  }
  {
    nn::ResNetOptions o;  // examples/cnn_digits.yaml
    o.in_channels = 1;
    o.height = 8;
    o.width = 8;
    o.num_classes = 10;
    o.widths = {16, 32};
    o.blocks_per_stage = 1;
    ModelCase c;
    c.name = "cnn_digits (resnet 1x8x8 16-32)";
    c.model = std::make_unique<nn::ResNetCnn>(o);
    c.spec = {{"kind", "cnn"},      {"channels", 1}, {"height", 8},  {"width", 8},
              {"widths", {16, 32}}, {"blocks", 1},   {"classes", 10}};
    c.features = 64;
    m.push_back(std::move(c));
  }
  return m;
}

// The int8 program of `g` by the `kiln quantize` rewrite: every site's activation scale from the
// min-max of its input over `calib`.
absl::StatusOr<compiler::Int8Program> Quantize(runtime::Backend& backend, const ir::Graph& g,
                                               const std::map<std::string, Tensor>& weights,
                                               const Tensor& calib) {
  std::set<std::string> names;
  for (const auto& [n, t] : weights) names.insert(n);
  std::vector<compiler::Int8Site> sites = compiler::FindInt8Sites(g, names);
  if (sites.empty()) return absl::FailedPreconditionError("no int8 sites");
  auto cg = compiler::CalibrationProgram(g, sites);
  if (!cg.ok()) return cg.status();
  KilnRun c;
  absl::Status s = c.Prepare(backend, *cg, weights, calib);
  if (!s.ok()) return s;
  const size_t first = g.outputs().size();
  std::vector<float> scales;
  for (size_t k = 0; k < sites.size(); ++k) {
    const Tensor& t = c.outs[first + k];
    double absmax = 0;
    for (int64_t i = 0; i < t.num_elements(); ++i)
      absmax = std::max(absmax, static_cast<double>(std::fabs(t.data<float>()[i])));
    scales.push_back(compiler::SymmetricScale(absmax));
  }
  return compiler::RewriteInt8(g, weights, sites, scales);
}

// ORT's profile file (a Chrome trace: one "Node" event per kernel run, "dur" in microseconds,
// args.op_name) summed per node name and divided by the number of model runs.
json SummarizeOrtProfile(const std::string& path) {
  std::ifstream f(path);
  json trace = json::parse(f, nullptr, false);
  if (trace.is_discarded() || !trace.is_array()) return {{"error", "cannot parse " + path}};
  std::map<std::string, std::pair<std::string, double>> by_node;  // name -> (op, total us)
  std::vector<std::string> order;
  int runs = 0;
  for (const json& e : trace) {
    const std::string cat = e.value("cat", ""), name = e.value("name", "");
    if (cat == "Session" && name == "model_run") ++runs;
    if (cat != "Node" || name.size() < 12 || name.substr(name.size() - 12) != "_kernel_time")
      continue;
    const std::string node = name.substr(0, name.size() - 12);
    std::string op = e.contains("args") ? e["args"].value("op_name", "") : "";
    if (!by_node.count(node)) order.push_back(node);
    by_node[node].first = op;
    by_node[node].second += e.value("dur", 0.0);
  }
  json kernels = json::array();
  for (const std::string& n : order)
    kernels.push_back({{"name", n + " (" + by_node[n].first + ")"},
                       {"us", by_node[n].second / std::max(runs, 1)}});
  return {{"runs", runs}, {"kernels", kernels}};
}

void PrintProfile(const char* who, const json& p) {
  if (!p.contains("kernels")) {
    printf("  %s profile: %s\n", who, p.value("error", std::string("none")).c_str());
    return;
  }
  double sum = 0;
  for (const json& k : p["kernels"]) sum += k["us"].get<double>();
  printf("  %s per-kernel profile (mean us per run; kernels sum to %.1f us):\n", who, sum);
  for (const json& k : p["kernels"])
    printf("    %9.1f us %5.1f%%  %s\n", k["us"].get<double>(),
           sum > 0 ? 100 * k["us"].get<double>() / sum : 0.0, k["name"].get<std::string>().c_str());
}

std::string Fmt(const char* f, double v) {
  char b[64];
  snprintf(b, sizeof(b), f, v);
  return b;
}

// ---- the machine's roofline (roofline.h), measured in this run ----

double LoadAverage() {
  std::ifstream f("/proc/loadavg");
  double l = -1;
  f >> l;
  return l;
}

// The size of CPU 0's data or unified cache at `level`, from sysfs (glibc's sysconf reports the
// host's L3 under KVM: 384 MiB on a guest whose L3 is 32 MiB); `fallback` when it says nothing.
int64_t CacheBytes(int level, int64_t fallback) {
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream lf(dir + "level"), tf(dir + "type"), sf(dir + "size");
    int l = 0;
    std::string type, size;
    if (!(lf >> l) || !(tf >> type) || !(sf >> size)) continue;
    if (l != level || type == "Instruction" || size.empty()) continue;
    int64_t v = std::atoll(size.c_str());
    if (size.back() == 'K') v <<= 10;
    if (size.back() == 'M') v <<= 20;
    if (v > 0) return v;
  }
  return fallback;
}

std::string MiB(int64_t bytes) { return Fmt("%.1f MiB", bytes / 1048576.0); }

// The FMA peak and the read bandwidth at the cache levels' sizes (half of each core's L2 on every
// thread, half the L3, twice the L3 for DRAM) and at every row's working set.
struct Machine {
  FmaPeak peak;
  std::map<int64_t, ReadBandwidth> bandwidth;  // by the working set asked for
  std::vector<std::pair<std::string, int64_t>> levels;

  double GbPerS(int64_t bytes, int threads) {
    auto it = bandwidth.find(bytes);
    if (it == bandwidth.end())
      it = bandwidth.emplace(bytes, MeasureReadBandwidth(bytes, threads)).first;
    return it->second.gb_per_s;
  }
  // The bandwidth the roof uses at working set `bytes`: the best measured at `bytes` or at any
  // larger working set (a smaller one never reads slower; under load a smaller one's own figure
  // can come out lower than a larger one's).
  double RoofGbPerS(int64_t bytes, int threads) {
    double best = GbPerS(bytes, threads);
    for (auto it = bandwidth.lower_bound(bytes); it != bandwidth.end(); ++it)
      best = std::max(best, it->second.gb_per_s);
    return best;
  }
  // Measures the peak and the bandwidth at `bytes` again and keeps the better: load from other
  // processes only ever lowers them, so the best seen in the run is the closest to the machine's.
  void Refresh(int64_t bytes, int threads) {
    FmaPeak p = MeasureFmaPeak(threads);
    p.repetitions += peak.repetitions;
    if (p.gflop_per_s < peak.gflop_per_s) p.gflop_per_s = peak.gflop_per_s;
    peak = p;
    ReadBandwidth b = MeasureReadBandwidth(bytes, threads);
    auto it = bandwidth.find(bytes);
    if (it == bandwidth.end()) {
      bandwidth.emplace(bytes, b);
      return;
    }
    b.repetitions += it->second.repetitions;
    b.gb_per_s = std::max(b.gb_per_s, it->second.gb_per_s);
    it->second = b;
  }
};

Machine MeasureMachine(int threads, const std::vector<int64_t>& row_working_sets) {
  Machine m;
  m.peak = MeasureFmaPeak(threads);
  const int64_t l2 = CacheBytes(2, 1 << 20);
  const int64_t l3 = CacheBytes(3, 32 << 20);
  m.levels = {
      {"L2", threads * l2 / 2}, {"L3", l3 / 2}, {"DRAM", std::max<int64_t>(2 * l3, 64 << 20)}};
  for (const auto& [name, bytes] : m.levels) m.GbPerS(bytes, threads);
  for (int64_t ws : row_working_sets) m.GbPerS(ws, threads);
  return m;
}

json BandwidthJson(const ReadBandwidth& b) {
  return {{"bytes", b.bytes},
          {"gb_per_s", b.gb_per_s},
          {"threads", b.threads},
          {"repetitions", b.repetitions}};
}

json PeakJson(const FmaPeak& p) {
  return {{"gflop_per_s", p.gflop_per_s},
          {"isa", FmaIsaName(p.isa)},
          {"threads", p.threads},
          {"repetitions", p.repetitions}};
}

}  // namespace

namespace {

// Every row's working set (from the graph Kiln compiles), then the FMA peak and the read
// bandwidth at those sizes, measured before the peer's process starts; printed.
Machine MeasureRoofline(int threads, double* load_before) {
  std::vector<int64_t> working_sets;
  for (ModelCase& mc : Models())
    for (int64_t batch : {int64_t{1}, int64_t{256}}) {
      auto g = mc.model->PredictGraph(batch);
      auto cost = g.ok() ? CountGraphCost(*g, {"x"}) : g.status();
      if (cost.ok()) working_sets.push_back(cost->working_set_bytes());
    }
  *load_before = LoadAverage();
  Machine machine = MeasureMachine(threads, working_sets);
  printf(
      "\nroofline (measured now, best of %d; load average %.1f, a busy machine measures low): f32 "
      "FMA peak %.0f GFLOP/s on %d threads (%s); read bandwidth on %d threads:",
      machine.peak.repetitions, *load_before, machine.peak.gflop_per_s, machine.peak.threads,
      FmaIsaName(machine.peak.isa).c_str(), threads);
  for (const auto& [name, bytes] : machine.levels)
    printf(" %s %s %.0f GB/s,", MiB(machine.bandwidth[bytes].bytes).c_str(), name.c_str(),
           machine.bandwidth[bytes].gb_per_s);
  printf(" rows' working sets:");
  for (int64_t ws : working_sets)
    printf(" %s %.0f GB/s", MiB(machine.bandwidth[ws].bytes).c_str(),
           machine.bandwidth[ws].gb_per_s);
  printf("\n");
  return machine;
}

// Each side's per-call floor: y = x + x on 16 floats. The peer's includes node's N-API call and
// its promise; Kiln's is Executable::RunInto. Rows also give the ratio with ORT's floor taken off
// (ORT's kernels alone, the comparison least favourable to Kiln). Returns the floor's row.
json MeasureFloor(runtime::Backend& backend, OrtPeer* peer, const ComputeBenchOptions& o,
                  double* ort_floor) {
  json floor = {{"model", "floor: y = x + x, 16 floats"}, {"batch", 1}};
  auto g = ir::ParseGraph(R"(graph @tiny {
  %0 = parameter() {index=0, name="x"} : f32[1,16]
  %1 = add(%0, %0) : f32[1,16]
  return y=%1
}
)");
  KilnRun k;
  Tensor x = RandomInput(Shape{1, 16}, 3);
  if (g.ok() && k.Prepare(backend, *g, {}, x).ok()) floor["kiln_us"] = Median(k.Time(0.3));
  const std::string onnx = o.work_dir + "/tiny.onnx", in_path = o.work_dir + "/tiny_in.f32";
  const std::string cmd = "OMP_NUM_THREADS=1 " + o.python + " " + o.exporter +
                          " '{\"kind\":\"tiny\",\"features\":16}' none 1 " + onnx + " > " +
                          o.work_dir + "/export.log 2>&1";
  if (peer && WriteRaw(in_path, x) && std::system(cmd.c_str()) == 0 &&
      peer->Call({{"cmd", "load"}, {"name", "tiny"}, {"path", onnx}, {"threads", o.threads}})
          .value("ok", false)) {
    json r = peer->Call({{"cmd", "run"},
                         {"name", "tiny"},
                         {"input", in_path},
                         {"shape", {1, 16}},
                         {"iters", 3000}});
    if (r.value("ok", false)) {
      std::vector<double> us = r["us"].get<std::vector<double>>();
      us.erase(us.begin(), us.begin() + 500);  // warm-up
      *ort_floor = Median(us);
      floor["ort_us"] = *ort_floor;
    }
  }
  printf("per-call floor (y = x + x, 16 floats): kiln %.1f us, ort %.1f us\n",
         floor.value("kiln_us", 0.0), *ort_floor);
  return floor;
}

// The peer's copy of one row's model: exported to ONNX from the same weights, loaded in the node
// process, its input written where the peer reads it.
struct OrtModel {
  OrtPeer* peer = nullptr;
  std::string onnx, in_path, out_path, name;
  int64_t batch = 0, features = 0;
  bool loaded = false;
  std::string error;  // of the last failed run

  // Microseconds per run for `iters` runs; empty (and `error` set) when the run failed.
  std::vector<double> Time(int iters) {
    json r = peer->Call({{"cmd", "run"},
                         {"name", name},
                         {"input", in_path},
                         {"shape", {batch, features}},
                         {"iters", iters},
                         {"out", out_path}});
    if (!r.value("ok", false)) {
      error = r.value("error", std::string("no error given"));
      return {};
    }
    return r["us"].get<std::vector<double>>();
  }
};

// Exports and loads `mc` at `batch` in the peer (the weights at `st`, written with status `ws`);
// on failure says why in row["ort_skipped"].
OrtModel LoadOrtModel(OrtPeer* peer, const std::string& why, const ModelCase& mc, int64_t batch,
                      const std::string& st, const absl::Status& ws, const Tensor& x,
                      const ComputeBenchOptions& o, json& row) {
  const std::string tag = mc.spec["kind"].get<std::string>();
  OrtModel m;
  m.peer = peer;
  m.onnx = o.work_dir + "/" + tag + "_b" + std::to_string(batch) + ".onnx";
  m.in_path = o.work_dir + "/" + tag + "_in.f32";
  m.out_path = o.work_dir + "/" + tag + "_ort_out.f32";
  m.name = tag + "_b" + std::to_string(batch);
  m.batch = batch;
  m.features = mc.features;
  if (!peer) {
    row["ort_skipped"] = why;
    return m;
  }
  if (!ws.ok()) {
    row["ort_skipped"] = std::string(ws.message());
    return m;
  }
  const std::string cmd = "OMP_NUM_THREADS=1 " + o.python + " " + o.exporter + " '" +
                          mc.spec.dump() + "' " + st + " " + std::to_string(batch) + " " + m.onnx +
                          " > " + o.work_dir + "/export.log 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    row["ort_skipped"] = "export_onnx.py failed (see " + o.work_dir + "/export.log)";
    return m;
  }
  json r =
      peer->Call({{"cmd", "load"}, {"name", m.name}, {"path", m.onnx}, {"threads", o.threads}});
  if (!r.value("ok", false)) {
    row["ort_skipped"] = r.value("error", "load failed");
    return m;
  }
  WriteRaw(m.in_path, x);
  m.loaded = true;
  return m;
}

// Kiln's three ways of running one row: f32 with the weights bound (as kiln serve runs it), f32
// with the weights passed per run, int8 by the quantize rewrite.
struct KilnSides {
  KilnRun f32, unbound, int8;
  bool have_unbound = false, have_int8 = false;
};

// Prepares `k`; the f32 side's error (the row's "error"), the others' into the row.
absl::Status PrepareKiln(runtime::Backend& backend, const ir::Graph& g,
                         const std::map<std::string, Tensor>& weights, const Tensor& x,
                         const ModelCase& mc, int64_t batch, KilnSides& k, json& row) {
  absl::Status s = k.f32.Prepare(backend, g, weights, x);
  if (!s.ok()) return s;
  k.have_unbound = k.unbound.Prepare(backend, g, weights, x, /*bind_weights=*/false).ok();
  // int8 through the kiln quantize rewrite (calibrated on 64 random rows).
  auto q = Quantize(backend, g, weights, RandomInput(Shape{batch, mc.features}, 99));
  if (q.ok()) {
    s = k.int8.Prepare(backend, q->program, q->weights, x);
    k.have_int8 = s.ok();
    if (!s.ok()) row["int8_error"] = std::string(s.message());
  } else {
    row["int8_error"] = std::string(q.status().message());
  }
  return absl::OkStatus();
}

struct RowTimes {
  std::vector<double> kiln, ort, int8, unbound;
};

// Alternating rounds: Kiln f32, then ORT for as many runs as Kiln took in its share of the round
// (at least 5), then unbound and int8 Kiln.
RowTimes TimeRounds(KilnSides& k, OrtModel& ort, bool& have_ort, const ComputeBenchOptions& o,
                    json& row) {
  RowTimes t;
  if (have_ort) ort.Time(5);  // warm-up
  for (int round = 0; round < o.rounds; ++round) {
    std::vector<double> kr = k.f32.Time(o.seconds_per_round);
    t.kiln.insert(t.kiln.end(), kr.begin(), kr.end());
    if (have_ort) {
      const double med = Median(kr);
      const int iters = std::max(5, static_cast<int>(o.seconds_per_round * 1e6 / med));
      std::vector<double> r = ort.Time(iters);
      if (r.empty()) {
        row["ort_skipped"] = "run failed: " + ort.error;
        have_ort = false;
      }
      t.ort.insert(t.ort.end(), r.begin(), r.end());
    }
    if (k.have_unbound) {
      std::vector<double> u = k.unbound.Time(o.seconds_per_round);
      t.unbound.insert(t.unbound.end(), u.begin(), u.end());
    }
    if (k.have_int8) {
      std::vector<double> i = k.int8.Time(o.seconds_per_round);
      t.int8.insert(t.int8.end(), i.begin(), i.end());
    }
  }
  return t;
}

// The printed columns of one row that are "-" unless their side ran.
struct RowColumns {
  std::string ort = "-", ratio = "-", diff = "-", int8 = "-", int8_ratio = "-", floor = "-";
};

// ORT's median and ratios, and the oracle: the same logits from both.
void AddOrtResults(const RowTimes& t, double kmed, double ort_floor, const Tensor& mine,
                   const std::string& out_path, json& row, RowColumns& cols) {
  const double omed = Median(t.ort);
  row["ort_us"] = omed;
  row["ort_runs"] = t.ort.size();
  row["ratio_kiln_over_ort"] = kmed / omed;
  std::vector<float> ort_logits = ReadRaw(out_path);
  double diff = 0, scale = 1e-6;
  if (static_cast<int64_t>(ort_logits.size()) == mine.num_elements()) {
    for (int64_t i = 0; i < mine.num_elements(); ++i) {
      diff = std::max(diff, std::fabs(double(ort_logits[i]) - mine.data<float>()[i]));
      scale = std::max(scale, std::fabs(double(mine.data<float>()[i])));
    }
    row["max_abs_diff_logits"] = diff;
    row["logits_agree"] = diff <= 1e-4 * scale + 1e-5;
  } else {
    row["logits_agree"] = false;
    row["max_abs_diff_logits"] = nullptr;
  }
  cols.ort = Fmt("%.1f", omed);
  cols.ratio = Fmt("%.2fx", kmed / omed);
  if (ort_floor > 0 && omed > ort_floor) {
    row["ratio_kiln_over_ort_minus_floor"] = kmed / (omed - ort_floor);
    cols.floor = Fmt("%.2fx", kmed / (omed - ort_floor));
  }
  cols.diff = Fmt("%.1e", diff);
}

// The roofline: the floor any implementation is bound by on this machine, and each side's time
// (ORT's where it ran; omed 0 otherwise) as a multiple of it; into row["roofline"], printed with
// the row.
void AddRoofline(const GraphCost& cost, const Roofline& roof, double kmed, bool have_ort,
                 double omed, const std::string& model, int64_t batch, const RowColumns& cols,
                 json& row) {
  json rl = {{"flops", cost.flops},
             {"contractions", cost.contractions},
             {"weight_bytes", cost.weight_bytes},
             {"input_bytes", cost.input_bytes},
             {"output_bytes", cost.output_bytes},
             {"min_bytes", cost.min_bytes()},
             {"working_set_bytes", cost.working_set_bytes()},
             {"peak_gflop_per_s", roof.peak_gflop_per_s},
             {"gb_per_s_at_working_set", roof.gb_per_s},
             {"compute_floor_us", roof.compute_floor_us},
             {"memory_floor_us", roof.memory_floor_us},
             {"floor_us", roof.floor_us},
             {"bound", roof.compute_bound ? "compute" : "memory"},
             {"kiln_over_floor", kmed / roof.floor_us},
             {"kiln_share_of_roof", RoofShare(roof, kmed)}};
  std::string ort_rf = "-", rf_ort = "-";
  if (have_ort) {
    rl["ort_over_floor"] = omed / roof.floor_us;
    rl["ort_share_of_roof"] = RoofShare(roof, omed);
    rl["best_ratio_over_ort"] = roof.floor_us / omed;
    rl["share_needed_for_0_8x_ort"] = roof.floor_us / (0.8 * omed);
    ort_rf = Fmt("%.2fx", omed / roof.floor_us);
    rf_ort = Fmt("%.2fx", roof.floor_us / omed);
  }
  const std::string verdict = Verdict(roof, kmed, omed, 0.8, "ORT");
  rl["verdict"] = verdict;
  row["roofline"] = rl;
  printf(
      "%-34s %6lld %12.1f %12.1f %12s %8s %10s %12s %10s %9s %7.1f %7.2f %9.1f %7.2fx %8s "
      "%7s\n",
      model.c_str(), static_cast<long long>(batch), kmed, row.value("kiln_unbound_us", 0.0),
      cols.ort.c_str(), cols.ratio.c_str(), cols.floor.c_str(), cols.int8.c_str(),
      cols.int8_ratio.c_str(), cols.diff.c_str(), cost.flops / 1e6, cost.min_bytes() / 1e6,
      roof.floor_us, kmed / roof.floor_us, ort_rf.c_str(), rf_ort.c_str());
  printf("  roofline: %s\n", verdict.c_str());
}

// After the timing: ORT's kernels under perf, and with --profile both sides' per-kernel times.
void ProfileRow(KilnSides& k, OrtModel& ort, bool have_ort, double omed,
                const ComputeBenchOptions& o, json& row) {
  if (have_ort && o.peer_kernels) {
    // About half a second of ORT runs under perf.
    const int iters = std::max(20, static_cast<int>(0.5e6 / omed));
    json pk = ProfilePeerKernels(ort.peer->pid(), o.work_dir, [&] { ort.Time(iters); });
    printf("  ort kernels: %s\n", pk.value("summary", pk.value("error", std::string("?"))).c_str());
    row["ort_kernels"] = pk;
  }
  if (!o.profile) return;
  json prof = {{"kiln", k.f32.Profile(o.profile_runs)}};
  PrintProfile("kiln", prof["kiln"]);
  if (have_ort) {
    // A second session with ORT's profiler on, so the timed one ran without it.
    const std::string prefix = o.work_dir + "/ort_profile_" + ort.name;
    json r = ort.peer->Call({{"cmd", "profile"},
                             {"path", ort.onnx},
                             {"threads", o.threads},
                             {"prefix", prefix},
                             {"input", ort.in_path},
                             {"shape", {ort.batch, ort.features}},
                             {"iters", o.profile_runs}});
    prof["ort"] = r.value("ok", false) ? SummarizeOrtProfile(r.value("file", ""))
                                       : json{{"error", r.value("error", "failed")}};
    PrintProfile("ort", prof["ort"]);
  }
  row["profile"] = prof;
}

// What a row runs against: the machine's roof, the backend, the peer (null: not running, `why`),
// ORT's per-call floor.
struct RowContext {
  Machine& machine;
  runtime::Backend& backend;
  OrtPeer* peer;
  const std::string& why;
  double ort_floor;
  const ComputeBenchOptions& o;
};

// One model at one batch size: Kiln's sides and ORT's timed in alternating rounds, the oracle,
// the roofline, a printed line.
json BenchRow(RowContext& ctx, const ModelCase& mc, int64_t batch,
              const std::map<std::string, Tensor>& weights, const std::string& st,
              const absl::Status& ws) {
  const ComputeBenchOptions& o = ctx.o;
  json row = {{"model", mc.name}, {"batch", batch}, {"threads", o.threads}};
  auto g = mc.model->PredictGraph(batch);
  if (!g.ok()) {
    row["error"] = std::string(g.status().message());
    return row;
  }
  auto cost = CountGraphCost(*g, {"x"});
  if (!cost.ok()) {
    row["error"] = "roofline: " + std::string(cost.status().message());
    return row;
  }
  ctx.machine.Refresh(cost->working_set_bytes(), o.threads);
  const Roofline roof = MakeRoofline(*cost, ctx.machine.peak.gflop_per_s,
                                     ctx.machine.RoofGbPerS(cost->working_set_bytes(), o.threads));
  Tensor x = RandomInput(Shape{batch, mc.features}, 7 + static_cast<uint32_t>(batch));
  KilnSides k;
  if (absl::Status s = PrepareKiln(ctx.backend, *g, weights, x, mc, batch, k, row); !s.ok()) {
    row["error"] = "kiln: " + std::string(s.message());
    return row;
  }
  // ORT on the same weights.
  OrtModel ort = LoadOrtModel(ctx.peer, ctx.why, mc, batch, st, ws, x, o, row);
  bool have_ort = ort.loaded;
  RowTimes t = TimeRounds(k, ort, have_ort, o, row);
  const double kmed = Median(t.kiln);
  row["kiln_us"] = kmed;
  row["kiln_runs"] = t.kiln.size();
  if (k.have_unbound) {
    row["kiln_unbound_us"] = Median(t.unbound);
    row["ratio_bound_over_unbound"] = kmed / Median(t.unbound);
  }
  RowColumns cols;
  if (have_ort) AddOrtResults(t, kmed, ctx.ort_floor, k.f32.outs[0], ort.out_path, row, cols);
  if (k.have_int8) {
    const double imed = Median(t.int8);
    row["kiln_int8_us"] = imed;
    row["ratio_int8_over_f32"] = imed / kmed;
    cols.int8 = Fmt("%.1f", imed);
    cols.int8_ratio = Fmt("%.2fx", imed / kmed);
  }
  const double omed = have_ort ? row["ort_us"].get<double>() : 0.0;
  AddRoofline(*cost, roof, kmed, have_ort, omed, mc.name, batch, cols, row);
  if (row.contains("ort_skipped"))
    printf("  ort skipped: %s\n", row["ort_skipped"].get<std::string>().c_str());
  ProfileRow(k, ort, have_ort, omed, o, row);
  fflush(stdout);
  return row;
}

// What the roof was computed from: the FMA peak before and after the rows, the read bandwidth
// at each working set measured.
json MachineJson(const Machine& machine, const FmaPeak& after, double load_before) {
  json bw = json::array();
  for (const auto& [asked, b] : machine.bandwidth) {
    json e = BandwidthJson(b);
    for (const auto& [name, bytes] : machine.levels)
      if (bytes == asked) e["level"] = name;
    bw.push_back(e);
  }
  return {{"fma_peak", PeakJson(machine.peak)},
          {"fma_peak_after_rows", PeakJson(after)},
          {"read_bandwidth", bw},
          {"load_average_before", load_before},
          {"l2_bytes_per_core", CacheBytes(2, 0)},
          {"l3_bytes", CacheBytes(3, 0)}};
}

}  // namespace

json RunComputeBench(const ComputeBenchOptions& options, json* machine_out) {
  json rows = json::array();
  // A directory of this process's own under work_dir: two runs at once (two people on one machine)
  // would otherwise overwrite each other's models and inputs (ORT then reads the other batch's).
  ComputeBenchOptions o = options;
  mkdir(o.work_dir.c_str(), 0755);
  o.work_dir += "/run_" + std::to_string(getpid());
  mkdir(o.work_dir.c_str(), 0755);
  double load_before = 0;
  Machine machine = MeasureRoofline(o.threads, &load_before);
  std::string why;
  std::unique_ptr<OrtPeer> peer = OrtPeer::Start(o, &why);
  auto backend = runtime::MakeCpuBackend();
  printf(
      "\ncompute: Kiln (cpu backend, weights bound constant) vs ONNX Runtime %s, %d threads "
      "each, %d alternating rounds of %.2f s; median us per forward pass\n",
      "(onnxruntime-node)", o.threads, o.rounds, o.seconds_per_round);
  double ort_floor = 0;
  rows.push_back(MeasureFloor(*backend, peer.get(), o, &ort_floor));
  printf("%-34s %6s %12s %12s %12s %8s %10s %12s %10s %9s %7s %7s %9s %8s %8s %7s\n", "model",
         "batch", "kiln f32 us", "unbound us", "ort us", "kiln/ort", "-floor", "kiln int8 us",
         "int8/f32", "max|diff|", "MFLOP", "MB", "roof us", "kiln/rf", "ort/rf", "rf/ort");
  RowContext ctx{machine, *backend, peer.get(), why, ort_floor, o};
  for (ModelCase& mc : Models()) {
    auto params = nn::InitParams(mc.model->Params(), /*seed=*/0);
    if (!params.ok()) {
      rows.push_back({{"model", mc.name}, {"error", std::string(params.status().message())}});
      continue;
    }
    std::map<std::string, Tensor> weights;
    std::vector<std::pair<std::string, Tensor>> list;
    for (const std::string& n : params->names()) {
      weights[n] = *params->Get(n);
      list.push_back({n, weights[n]});
    }
    const std::string st = o.work_dir + "/" + mc.spec["kind"].get<std::string>() + ".safetensors";
    absl::Status ws = WriteSafetensors(st, list);
    for (int64_t batch : {int64_t{1}, int64_t{256}})
      rows.push_back(BenchRow(ctx, mc, batch, weights, st, ws));
  }
  // The peak again after the rows: a figure well above the one the rows used says the machine was
  // busy while they ran (their roof is low, their shares of it high).
  const FmaPeak after = MeasureFmaPeak(o.threads);
  const double drift = after.gflop_per_s / machine.peak.gflop_per_s - 1;
  printf(
      "roofline: FMA peak after the rows %.0f GFLOP/s, %+.0f%% against the best the rows used "
      "(%.0f; load average now %.1f)%s\n",
      after.gflop_per_s, 100 * drift, machine.peak.gflop_per_s, LoadAverage(),
      drift > 0.1 ? ": the machine was busy, the roof above is low; rerun on a quiet machine" : "");
  // Kept for --profile (its ORT traces are there), removed otherwise.
  if (!o.profile) {
    std::error_code ec;
    std::filesystem::remove_all(o.work_dir, ec);
  }
  if (machine_out) *machine_out = MachineJson(machine, after, load_before);
  return rows;
}

}  // namespace kiln::bench
