#include "kiln/base/cpu_isa.h"

#include <atomic>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace kiln {
namespace {

constexpr std::pair<CpuIsa, const char*> kNames[] = {{CpuIsa::kSse41, "sse41"},
                                                     {CpuIsa::kAvx2, "avx2"},
                                                     {CpuIsa::kAvx512, "avx512"},
                                                     {CpuIsa::kAvx512Vnni, "avx512_vnni"},
                                                     {CpuIsa::kAvx512Bf16, "avx512_bf16"},
                                                     {CpuIsa::kAmx, "amx"}};

// The cap asked for and the decision.
std::mutex g_mu;
std::optional<CpuIsa> g_cap;
std::atomic<int> g_level{-1};  // the decided level; -1 until decided

CpuIsa DecideLocked() {
  const int v = g_level.load(std::memory_order_acquire);
  if (v >= 0) return static_cast<CpuIsa>(v);
  const CpuIsa host = HostCpuIsa();
  const CpuIsa level = g_cap && *g_cap < host ? *g_cap : host;
  g_level.store(static_cast<int>(level), std::memory_order_release);
  return level;
}

}  // namespace

std::string CpuIsaName(CpuIsa isa) {
  for (const auto& [value, name] : kNames)
    if (value == isa) return name;
  return absl::StrCat("isa-", static_cast<int>(isa));
}

std::vector<CpuIsa> AllCpuIsas() {
  std::vector<CpuIsa> out;
  for (const auto& [value, name] : kNames) out.push_back(value);
  return out;
}

absl::StatusOr<CpuIsa> ParseCpuIsa(std::string_view name) {
  if (name == "native") return HostCpuIsa();
  std::vector<std::string> choices;
  for (const auto& [value, n] : kNames) {
    if (name == n) return value;
    choices.push_back(n);
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown CPU ISA level '%s' (KILN_CPU_ISA): choose one of %s, or native",
                      name, absl::StrJoin(choices, ", ")));
}

CpuIsa HostCpuIsa() {
  static const CpuIsa host = [] {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("x86-64-v3")) return CpuIsa::kSse41;
    if (!__builtin_cpu_supports("x86-64-v4")) return CpuIsa::kAvx2;
    if (!__builtin_cpu_supports("avx512vnni")) return CpuIsa::kAvx512;
    if (!__builtin_cpu_supports("avx512bf16")) return CpuIsa::kAvx512Vnni;
    if (!__builtin_cpu_supports("amx-tile")) return CpuIsa::kAvx512Bf16;
    return CpuIsa::kAmx;
  }();
  return host;
}

absl::Status SetCpuIsaCap(CpuIsa cap) {
  std::lock_guard<std::mutex> lock(g_mu);
  const CpuIsa host = HostCpuIsa();
  const CpuIsa want = cap < host ? cap : host;
  const int v = g_level.load(std::memory_order_acquire);
  if (v >= 0) {
    if (static_cast<CpuIsa>(v) == want) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot cap the CPU ISA at %s: this process already runs at %s (set the cap before the "
        "first kernel or backend)",
        CpuIsaName(want), CpuIsaName(static_cast<CpuIsa>(v))));
  }
  g_cap = cap;
  DecideLocked();
  return absl::OkStatus();
}

absl::Status ApplyCpuIsaSetting(std::string_view value, bool strict) {
  if (value.empty()) return absl::OkStatus();
  absl::StatusOr<CpuIsa> isa = ParseCpuIsa(value);
  if (!isa.ok()) return isa.status();
  if (strict && *isa > HostCpuIsa()) {
    return absl::OutOfRangeError(absl::StrFormat("KILN_CPU_ISA=%s, but this CPU runs at most %s",
                                                 value, CpuIsaName(HostCpuIsa())));
  }
  return SetCpuIsaCap(*isa);
}

CpuIsa ActiveCpuIsa() {
  const int v = g_level.load(std::memory_order_acquire);
  if (v >= 0) return static_cast<CpuIsa>(v);
  std::lock_guard<std::mutex> lock(g_mu);
  return DecideLocked();
}

bool CpuIsaCapped() { return ActiveCpuIsa() < HostCpuIsa(); }

}  // namespace kiln
