// What the CTest pass sweeps ask a test binary for: the *_without_<pass> and *_verify_each_pass
// entries (tests/CMakeLists.txt, src/kiln/runtime/cpu/CMakeLists.txt) rerun op_table_test,
// golden_test and fusion_fuzz_test with KILN_DISABLE_PASSES / KILN_VERIFY_EACH_PASS / KILN_DUMP_IR
// set. The libraries read no environment, so these binaries read it here, the way the kiln CLI
// does (compiler::ApplyPipelineVariables), and build their cpu backends with the result:
//
//   auto cpu = runtime::MakeCpuBackend(testing::SweepCpuOptions({.use_compile_cache = false}));
//   ...
//   TEST(PassSweep, ReachesTheBackend) { EXPECT_TRUE(testing::SweepReaches(*cpu)); }
#ifndef KILN_TESTS_SUPPORT_PASS_SWEEP_H_
#define KILN_TESTS_SUPPORT_PASS_SWEEP_H_

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kiln/compiler/pipeline.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/runtime/executable.h"

namespace kiln::testing {

// The pipeline options the environment asks for, read once. A name in KILN_DISABLE_PASSES that is
// no pass aborts the binary with the CLI's message (a sweep with a typo must not silently run
// every pass).
const compiler::PipelineOptions& SweepPipelineOptions();

// `options` with SweepPipelineOptions() as its pipeline options.
runtime::CpuBackendOptions SweepCpuOptions(runtime::CpuBackendOptions options = {});

// True when the sweep disables `pass`.
bool SweepDisables(const std::string& pass);

// The proof that a sweep really runs without its pass: every name KILN_DISABLE_PASSES holds (read
// here straight from the environment) is in `cpu`'s Describe()["disabled_passes"] (the backend
// was built with the sweep's options), and a cpu backend built with those options and an IR dump
// folder runs no disabled pass (its dumps, one pair per pass that ran, name none of them) while
// it runs the others. Fails when the environment was ignored.
::testing::AssertionResult SweepReaches(const runtime::Backend& cpu);

}  // namespace kiln::testing

#endif  // KILN_TESTS_SUPPORT_PASS_SWEEP_H_
