#include "kiln/runtime/cpu/isa.h"

#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/log.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace kiln::runtime {
namespace {

dnnl::cpu_isa ToOneDnn(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kSse41:
      return dnnl::cpu_isa::sse41;
    case CpuIsa::kAvx2:
      return dnnl::cpu_isa::avx2;
    case CpuIsa::kAvx512:
      return dnnl::cpu_isa::avx512_core;
    case CpuIsa::kAvx512Vnni:
      return dnnl::cpu_isa::avx512_core_vnni;
    case CpuIsa::kAvx512Bf16:
      return dnnl::cpu_isa::avx512_core_bf16;
    case CpuIsa::kAmx:
      return dnnl::cpu_isa::avx512_core_amx;
  }
  return dnnl::cpu_isa::all;
}

}  // namespace

void EnsureOneDnnIsa() {
  static std::once_flag once;
  std::call_once(once, [] {
    const CpuIsa level = ActiveCpuIsa();
    if (level >= HostCpuIsa()) return;  // oneDNN keeps its own detection (AMX permission)
    try {
      dnnl::set_max_cpu_isa(ToOneDnn(level));
    } catch (const dnnl::error& e) {
      KILN_LOG(WARNING) << "oneDNN could not be capped at " << CpuIsaName(level) << " (" << e.what()
                        << "): a oneDNN primitive ran before the cap";
    }
  });
}

std::string OneDnnIsaName() {
  EnsureOneDnnIsa();
  const std::pair<dnnl::cpu_isa, const char*> names[] = {
      {dnnl::cpu_isa::sse41, "sse41"},
      {dnnl::cpu_isa::avx, "avx"},
      {dnnl::cpu_isa::avx2, "avx2"},
      {dnnl::cpu_isa::avx2_vnni, "avx2_vnni"},
      {dnnl::cpu_isa::avx512_core, "avx512_core"},
      {dnnl::cpu_isa::avx512_core_vnni, "avx512_core_vnni"},
      {dnnl::cpu_isa::avx512_core_bf16, "avx512_core_bf16"},
      {dnnl::cpu_isa::avx512_core_amx, "avx512_core_amx"}};
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  for (const auto& [value, name] : names)
    if (isa == value) return name;
  return absl::StrFormat("isa-0x%x", static_cast<unsigned>(isa));
}

bool OneDnnHasBf16() {
  EnsureOneDnnIsa();
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  return isa == dnnl::cpu_isa::avx512_core || isa == dnnl::cpu_isa::avx512_core_vnni ||
         isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
}

bool OneDnnHasExactInt8() {
  EnsureOneDnnIsa();
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  return isa == dnnl::cpu_isa::avx512_core_vnni || isa == dnnl::cpu_isa::avx512_core_bf16 ||
         isa == dnnl::cpu_isa::avx512_core_amx;
}

std::string CpuIsaDescription() {
  const CpuIsa level = ActiveCpuIsa();
  std::string out = absl::StrCat(CpuIsaName(level), " (oneDNN ", OneDnnIsaName(), ")");
  if (level < HostCpuIsa()) absl::StrAppend(&out, ", capped from ", CpuIsaName(HostCpuIsa()));
  return out;
}

}  // namespace kiln::runtime
