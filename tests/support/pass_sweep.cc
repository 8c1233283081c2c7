#include "tests/support/pass_sweep.h"

#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "kiln/compiler/compile.h"
#include "kiln/ir/builder.h"

namespace kiln::testing {
namespace {

// A small graph for the dump check (a pass leaves dumps whether or not it changes anything):
// tanh(exp(x * 1) + exp(x * 1)), some of it for simplify, a chain for fusion.
ir::Graph ProbeGraph() {
  ir::Builder b("pass_sweep_probe");
  ir::Value x = b.Parameter("x", DType::kF32, Shape({4, 8}));
  ir::Value one = ir::BroadcastTo(b.Scalar(1.0, DType::kF32), Shape({4, 8}));
  ir::Value y = ir::Tanh(ir::Add(ir::Exp(ir::Mul(x, one)), ir::Exp(ir::Mul(x, one))));
  b.Output("y", y);
  absl::StatusOr<ir::Graph> g = b.Build();
  if (!g.ok()) {
    std::fprintf(stderr, "pass sweep: probe graph: %s\n", g.status().ToString().c_str());
    std::abort();
  }
  return *std::move(g);
}

std::vector<std::string> RawDisabledNames() {
  std::vector<std::string> out;
  const char* v = std::getenv("KILN_DISABLE_PASSES");
  if (v == nullptr) return out;
  for (absl::string_view n : absl::StrSplit(v, ',', absl::SkipWhitespace()))
    out.emplace_back(absl::StripAsciiWhitespace(n));
  return out;
}

}  // namespace

const compiler::PipelineOptions& SweepPipelineOptions() {
  static const compiler::PipelineOptions* const options = [] {
    auto* o = new compiler::PipelineOptions;
    compiler::PipelineVariables vars;
    vars.disable_passes = std::getenv("KILN_DISABLE_PASSES");
    vars.verify_each_pass = std::getenv("KILN_VERIFY_EACH_PASS");
    vars.dump_ir = std::getenv("KILN_DUMP_IR");
    absl::Status s = compiler::ApplyPipelineVariables(vars, o);
    if (!s.ok()) {
      std::fprintf(stderr, "pass sweep: %s\n", s.ToString().c_str());
      std::abort();
    }
    return o;
  }();
  return *options;
}

runtime::CpuBackendOptions SweepCpuOptions(runtime::CpuBackendOptions options) {
  options.pipeline = SweepPipelineOptions();
  return options;
}

bool SweepDisables(const std::string& pass) {
  const std::vector<std::string>& d = SweepPipelineOptions().disabled_passes;
  return std::find(d.begin(), d.end(), pass) != d.end();
}

::testing::AssertionResult SweepReaches(const runtime::Backend& cpu) {
  const std::vector<std::string> raw = RawDisabledNames();
  nlohmann::json described = cpu.Describe()["disabled_passes"];
  for (const std::string& name : raw) {
    if (std::find(described.begin(), described.end(), name) == described.end())
      return ::testing::AssertionFailure()
             << "KILN_DISABLE_PASSES names " << name << " but the backend under test disables "
             << described.dump();
  }
  const char* verify = std::getenv("KILN_VERIFY_EACH_PASS");
  if (verify != nullptr && *verify != '\0' &&
      SweepPipelineOptions().verify_each_pass != (std::string(verify) != "0"))
    return ::testing::AssertionFailure() << "KILN_VERIFY_EACH_PASS=" << verify << " was ignored";

  // Run the probe through a cpu backend with the sweep's options and IR dumps: each pass that
  // runs leaves NNN-before-<pass>.ir (a pass inside the simplify group: before-simplify.<pass>).
  namespace fs = std::filesystem;
  std::string dir = (fs::temp_directory_path() / "kiln_pass_sweep_XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) return ::testing::AssertionFailure() << "mkdtemp failed";
  runtime::CpuBackendOptions o = SweepCpuOptions({.use_compile_cache = false});
  o.pipeline.dump_dir = dir;
  absl::StatusOr<std::unique_ptr<runtime::Executable>> exe =
      runtime::MakeCpuBackend(o)->Compile(ProbeGraph());
  std::vector<std::string> ran;
  for (const fs::directory_entry& run : fs::directory_iterator(dir))
    for (const fs::directory_entry& f : fs::directory_iterator(run.path())) {
      std::string name = f.path().filename().string();
      size_t at = name.find("-before-");
      if (at == std::string::npos) continue;
      std::string pass = name.substr(at + 8, name.size() - at - 8 - 3);  // drop ".ir"
      if (size_t dot = pass.find('.'); dot != std::string::npos) pass = pass.substr(dot + 1);
      ran.push_back(pass);
    }
  fs::remove_all(dir);
  if (!exe.ok()) return ::testing::AssertionFailure() << exe.status();
  for (const std::string& name : raw) {
    if (std::find(ran.begin(), ran.end(), name) != ran.end())
      return ::testing::AssertionFailure() << "pass " << name << " ran although disabled";
  }
  for (const std::string& pass : compiler::AllPassNames()) {
    // remat is off; the group is its passes; the program passes need a precision policy or mesh.
    if (pass == "remat" || pass == "simplify" || pass == "mixed-precision" ||
        pass == "sharding-propagation" || pass == "spmd-partitioner")
      continue;
    const bool disabled =
        std::find(raw.begin(), raw.end(), pass) != raw.end() ||
        (std::find(raw.begin(), raw.end(), "simplify") != raw.end() && pass != "decompose" &&
         pass != "float-normalization" && pass != "fusion" && pass != "schedule");
    const bool did_run = std::find(ran.begin(), ran.end(), pass) != ran.end();
    if (!disabled && !did_run)
      return ::testing::AssertionFailure() << "pass " << pass << " did not run (no dump)";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace kiln::testing
