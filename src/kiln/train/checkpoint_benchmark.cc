// Checkpoint write throughput against a plain sequential write of the same bytes to the same disk
// (`dd if=/dev/zero bs=1M conv=fsync`), alternating the two, plus the time SaveAsync blocks the
// caller. Not a test.
//
//   checkpoint_benchmark [--dir=DIR] [--mb=256] [--reps=3] [--tensor_mb=8]
//
// DIR (default ./kiln_checkpoint_bench) is created and removed; it must be on the disk to
// measure. Each repetition runs dd and CheckpointManager::Save in ABBA order; the summary gives
// medians and their ratio.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kiln/base/crc32c.h"
#include "kiln/base/env.h"
#include "kiln/base/status.h"
#include "kiln/train/checkpoint.h"

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string Flag(int argc, char** argv, const std::string& name, const std::string& def) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return argv[i] + prefix.size();
  }
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln;
  const std::string dir = Flag(argc, argv, "dir", "./kiln_checkpoint_bench");
  const int mb = std::atoi(Flag(argc, argv, "mb", "256").c_str());
  const int reps = std::atoi(Flag(argc, argv, "reps", "3").c_str());
  const int tensor_mb = std::max(1, std::atoi(Flag(argc, argv, "tensor_mb", "8").c_str()));
  Env* env = Env::Default();
  if (env->FileExists(dir)) KILN_CHECK_OK(env->DeleteDir(dir));
  KILN_CHECK_OK(env->CreateDir(dir));

  // The "model": mb MiB of f32 tensors of tensor_mb MiB each, with non-trivial bytes.
  train::NamedTensors tensors;
  const int64_t per = int64_t{tensor_mb} << 18;  // f32 elements in tensor_mb MiB
  for (int i = 0; i < mb / tensor_mb; ++i) {
    Tensor t(DType::kF32, Shape{per});
    uint32_t* p = t.data<uint32_t>();
    for (int64_t j = 0; j < per; ++j) p[j] = static_cast<uint32_t>(j * 2654435761u + i);
    tensors.emplace_back(absl::StrCat("layer.", i, ".weight"), t);
  }
  const double bytes = static_cast<double>(mb / tensor_mb) * tensor_mb * (1 << 20);

  {
    const double t0 = Now();
    uint32_t c = crc32c::Value(tensors[0].second.raw_data(), tensors[0].second.byte_size());
    const double dt = Now() - t0;
    std::printf("crc32c (%s): %.1f GB/s (%08x)\n",
                crc32c::HardwareAccelerated() ? "sse4.2" : "table",
                tensors[0].second.byte_size() / dt / 1e9, c);
  }

  train::CheckpointOptions opts;
  opts.keep_last = 1000;  // old checkpoints are removed between runs, outside the timing
  auto mgr_or = train::CheckpointManager::Open(JoinPath(dir, "ckpt"), opts);
  KILN_CHECK_OK(mgr_or.status());
  auto& mgr = *mgr_or;
  const std::string dd_file = JoinPath(dir, "dd.bin");
  const std::string dd_cmd =
      absl::StrCat("dd if=/dev/zero of=", dd_file, " bs=1M count=", mb, " conv=fsync status=none");

  std::vector<double> dd_s, ckpt_s;
  auto run_dd = [&] {
    const double t0 = Now();
    if (std::system(dd_cmd.c_str()) != 0) {
      std::fprintf(stderr, "dd failed\n");
      std::exit(1);
    }
    dd_s.push_back(Now() - t0);
    KILN_CHECK_OK(env->DeleteFile(dd_file));
  };
  int64_t step = 0;
  auto run_ckpt = [&] {
    const double t0 = Now();
    KILN_CHECK_OK(mgr->Save(++step, tensors));
    ckpt_s.push_back(Now() - t0);
    KILN_CHECK_OK(env->DeleteDir(mgr->last_save_info().path));
  };
  std::printf("%.0f MiB in %zu tensors, dir %s, %d repetitions (ABBA order)\n", bytes / (1 << 20),
              tensors.size(), dir.c_str(), reps);
  for (int r = 0; r < reps; ++r) {
    if (r % 2 == 0) {
      run_dd();
      run_ckpt();
    } else {
      run_ckpt();
      run_dd();
    }
    std::printf("  rep %d: dd %.3f s (%.0f MB/s)   checkpoint %.3f s (%.0f MB/s)\n", r, dd_s.back(),
                bytes / dd_s.back() / 1e6, ckpt_s.back(), bytes / ckpt_s.back() / 1e6);
  }
  const double dd_med = Median(dd_s), ck_med = Median(ckpt_s);
  std::printf("median: dd %.0f MB/s, checkpoint %.0f MB/s, checkpoint/dd throughput ratio %.2f\n",
              bytes / dd_med / 1e6, bytes / ck_med / 1e6, dd_med / ck_med);

  // SaveAsync: what the training step waits for (the host copy), after the staging buffers were
  // reserved at startup.
  double reserve_s = Now();
  mgr->ReserveStaging(tensors);
  reserve_s = Now() - reserve_s;
  std::vector<double> block_s, write_s;
  for (int r = 0; r < reps; ++r) {
    const double t0 = Now();
    KILN_CHECK_OK(mgr->SaveAsync(++step, tensors));
    block_s.push_back(Now() - t0);
    KILN_CHECK_OK(mgr->Wait());
    write_s.push_back(mgr->last_save_info().write_micros / 1e6);
    KILN_CHECK_OK(env->DeleteDir(mgr->last_save_info().path));
  }
  std::printf(
      "SaveAsync: ReserveStaging %.3f s once at startup; then the caller blocks %.3f s "
      "(median; %.1f GB/s host copy) while the write takes %.3f s in the background\n",
      reserve_s, Median(block_s), bytes / Median(block_s) / 1e9, Median(write_s));
  mgr.reset();
  KILN_CHECK_OK(env->DeleteDir(dir));
  return 0;
}
