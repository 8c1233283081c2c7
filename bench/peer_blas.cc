#include "bench/peer_blas.h"

#include <fstream>
#include <iterator>
#include <sstream>
#include <utility>

namespace kiln::bench {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

}  // namespace

CpuInfo ParseCpuInfo(std::string_view text) {
  CpuInfo info;
  bool have_model = false, have_flags = false;
  while (!text.empty() && !(have_model && have_flags)) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view key = Trim(line.substr(0, colon)), value = Trim(line.substr(colon + 1));
    if (key == "model name" && !have_model) {
      info.model = std::string(value);
      have_model = true;
    } else if (key == "flags" && !have_flags) {
      std::istringstream words{std::string(value)};
      for (std::string w; words >> w;) info.flags.insert(w);
      have_flags = true;
    }
  }
  return info;
}

CpuInfo ReadCpuInfo() {
  std::ifstream in("/proc/cpuinfo");
  std::stringstream text;
  text << in.rdbuf();
  return ParseCpuInfo(text.str());
}

int OpenBlasCoreLevel(std::string_view core) {
  static const std::pair<const char*, int> kLevels[] = {
      {"Katmai", 0},      {"Coppermine", 0},   {"Northwood", 0},     {"Prescott", 0},
      {"Banias", 0},      {"Yonah", 0},        {"Core2", 0},         {"Penryn", 0},
      {"Dunnington", 0},  {"Nehalem", 0},      {"Atom", 0},          {"Athlon", 0},
      {"Opteron", 0},     {"Opteron_SSE3", 0}, {"Barcelona", 0},     {"Nano", 0},
      {"Bobcat", 0},      {"Sandybridge", 1},  {"Bulldozer", 1},     {"Piledriver", 1},
      {"Steamroller", 1}, {"Excavator", 1},    {"Haswell", 2},       {"Zen", 2},
      {"SkylakeX", 3},    {"Cooperlake", 4},   {"SapphireRapids", 5}};
  for (const auto& [name, level] : kLevels)
    if (core == name) return level;
  return -1;
}

int CpuBlasLevel(const CpuInfo& cpu) {
  bool avx512 = cpu.Has("avx512f") && cpu.Has("avx512cd") && cpu.Has("avx512bw") &&
                cpu.Has("avx512dq") && cpu.Has("avx512vl");
  if (avx512 && cpu.Has("avx512_bf16"))
    return 4;  // Cooperlake's kernels; AMX would be 5, but
               // SapphireRapids is newer than OpenBLAS 0.3.21
  if (avx512) return 3;
  if (cpu.Has("avx2") && cpu.Has("fma")) return 2;
  if (cpu.Has("avx")) return 1;
  return 0;
}

CpuInfo CapCpuInfo(CpuInfo cpu, std::string_view level) {
  const bool sse41 = level == "sse41";
  const bool avx2 = sse41 || level == "avx2";
  const bool avx512 = avx2 || level == "avx512";
  const bool vnni = avx512 || level == "avx512_vnni";
  const bool bf16 = vnni || level == "avx512_bf16";
  static const std::set<std::string> kV3 = {"avx",  "avx2",       "fma",     "f16c",
                                            "bmi1", "bmi2",       "movbe",   "abm",
                                            "vaes", "vpclmulqdq", "avx_vnni"};
  for (auto it = cpu.flags.begin(); it != cpu.flags.end();) {
    const std::string& f = *it;
    const bool is_avx512 = f.rfind("avx512", 0) == 0;
    const bool drop = (bf16 && (f.rfind("amx", 0) == 0 || f == "avx512_fp16" || f == "avx_vnni")) ||
                      (vnni && f == "avx512_bf16") || (avx512 && f == "avx512_vnni") ||
                      (avx2 && is_avx512) || (sse41 && kV3.count(f) > 0);
    it = drop ? cpu.flags.erase(it) : std::next(it);
  }
  return cpu;
}

std::string BestOpenBlasCore(const CpuInfo& cpu) {
  switch (CpuBlasLevel(cpu)) {
    case 4:
      return "Cooperlake";
    case 3:
      return "SkylakeX";
    case 2:
      return "Haswell";
    default:
      return "";
  }
}

bool IsGenericOpenBlasCore(std::string_view core, const CpuInfo& cpu) {
  return CpuBlasLevel(cpu) >= 2 && OpenBlasCoreLevel(core) < 2;
}

std::string SimdFlags(const CpuInfo& cpu) {
  std::string out;
  for (const std::string& f : cpu.flags) {
    if (f.rfind("avx", 0) == 0 || f.rfind("amx", 0) == 0 || f == "fma" || f == "f16c" ||
        f.rfind("sse4", 0) == 0) {
      out += (out.empty() ? "" : " ") + f;
    }
  }
  return out;
}

}  // namespace kiln::bench
