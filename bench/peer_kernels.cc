#include "bench/peer_kernels.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>

namespace kiln::bench {
namespace {

using nlohmann::json;

std::string Pct(double share) {
  char b[32];
  snprintf(b, sizeof(b), "%.0f%%", 100 * share);
  return b;
}

// stdout of `cmd` (through /bin/sh), or "" when it fails.
std::string Capture(const std::string& cmd) {
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return "";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  return pclose(f) == 0 ? out : "";
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  return lines;
}

std::map<uint64_t, std::string> Disassemble(const std::string& so, uint64_t lo, uint64_t hi) {
  char cmd[256];
  snprintf(cmd, sizeof(cmd),
           "objdump -d --no-show-raw-insn --start-address=0x%llx "
           "--stop-address=0x%llx ",
           static_cast<unsigned long long>(lo), static_cast<unsigned long long>(hi));
  return ParseObjdump(Capture(cmd + std::string("'") + so + "'"));
}

}  // namespace

std::map<uint64_t, double> ParsePerfReport(const std::string& report, const std::string& dso) {
  std::map<uint64_t, double> share;
  for (const std::string& line : Lines(report)) {
    if (line.empty() || line[0] == '#' || line.find(dso) == std::string::npos) continue;
    const size_t x = line.find("[.] 0x");
    if (x == std::string::npos) continue;
    share[std::strtoull(line.c_str() + x + 4, nullptr, 16)] += std::atof(line.c_str());
  }
  return share;
}

std::vector<std::pair<uint64_t, uint64_t>> SampleRanges(const std::map<uint64_t, double>& share,
                                                        size_t max_ranges) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [a, p] : share) {
    if (!ranges.empty() && a < ranges.back().second + 4096)
      ranges.back().second = a + 16;
    else
      ranges.push_back({a, a + 16});
  }
  if (ranges.size() > max_ranges) {
    auto weight = [&](const std::pair<uint64_t, uint64_t>& r) {
      double w = 0;
      for (auto it = share.lower_bound(r.first); it != share.end() && it->first < r.second; ++it)
        w += it->second;
      return w;
    };
    std::stable_sort(ranges.begin(), ranges.end(),
                     [&](const auto& x, const auto& y) { return weight(x) > weight(y); });
    ranges.resize(max_ranges);
    std::sort(ranges.begin(), ranges.end());
  }
  return ranges;
}

std::map<uint64_t, std::string> ParseObjdump(const std::string& text) {
  std::map<uint64_t, std::string> d;
  for (const std::string& line : Lines(text)) {
    // " 176d767:\tvbroadcastss (%rdi),%zmm3"
    const size_t colon = line.find(":\t");
    if (colon == std::string::npos) continue;
    char* end = nullptr;
    const uint64_t a = std::strtoull(line.c_str(), &end, 16);
    if (end != line.c_str() + colon) continue;  // not an address
    d[a] = line.substr(colon + 2);
  }
  return d;
}

json ClassifySamples(const std::map<uint64_t, double>& share,
                     const std::map<uint64_t, std::string>& insn, const std::string& library) {
  double total = 0;
  for (const auto& [a, p] : share) total += p;
  std::map<std::string, double> cls, mnemonic, fma;
  double known = 0;
  for (const auto& [a, p] : share) {
    auto it = insn.find(a);
    if (it == insn.end()) continue;
    known += p;
    std::vector<std::string> window = {it->second};
    for (auto w = it; window.size() < 4 && w != insn.begin();) {
      auto prev = std::prev(w);
      if (w->first - prev->first > 16) break;  // not the instruction right before
      w = prev;
      window.push_back(w->second);
    }
    std::string c = "other", m;
    for (const char* reg : {"pause", "zmm", "ymm", "xmm"}) {
      for (const std::string& i : window)
        if (i.find(reg) != std::string::npos) {
          c = reg;
          m = i.substr(0, i.find_first_of(" \t"));
          break;
        }
      if (!m.empty()) break;
    }
    cls[c] += p;
    const bool vector = c == "zmm" || c == "ymm" || c == "xmm";
    if (vector) mnemonic[m + " " + c] += p;
    if (vector && (m.rfind("vfmadd", 0) == 0 || m.rfind("vfnmadd", 0) == 0)) fma[c] += p;
  }
  if (known <= 0)
    return {{"error", "objdump could not disassemble the sampled addresses of " + library}};
  std::vector<std::pair<double, std::string>> top;
  for (const auto& [m, p] : mnemonic) top.push_back({p, m});
  std::sort(top.rbegin(), top.rend());
  json j = {{"library", library},
            {"share_of_samples_in_library", total / 100},
            {"share_of_those_classified", known / total}};
  std::string summary = Pct(total / 100) + " of the peer's samples in " +
                        library.substr(library.rfind('/') + 1) + "; of the " + Pct(known / total) +
                        " of those disassembled: ";
  for (const std::string c : {"zmm", "ymm", "xmm", "pause", "other"}) {
    j[c + "_share"] = cls[c] / known;
    summary += Pct(cls[c] / known) + " " + (c == "pause" ? "pause (spin)" : c) +
               (c == "other" ? "" : ", ");
  }
  json tj = json::array();
  for (size_t k = 0; k < top.size() && k < 3; ++k) {
    tj.push_back({{"insn", top[k].second}, {"share", top[k].first / known}});
    summary += (k ? ", " : " (top: ") + top[k].second + " " + Pct(top[k].first / known);
  }
  if (!top.empty()) summary += ")";
  j["top"] = tj;
  // The verdict from the width of the FMAs (a kernel's inner loop), not of every vector
  // instruction (copies are 128-bit anywhere).
  const double fz = fma["zmm"], fy = fma["ymm"], fx = fma["xmm"];
  std::string path = fz + fy + fx <= 0        ? "no FMA instruction was sampled"
                     : fz >= std::max(fy, fx) ? "its FMAs are 512-bit (zmm): AVX-512 kernels"
                     : fy >= fx ? "its FMAs are 256-bit (ymm): AVX2 kernels, not AVX-512"
                                : "its FMAs are 128-bit (xmm): neither AVX2 nor AVX-512 kernels";
  if (cls["other"] > 0.5 * (known - cls["pause"]))
    path += "; most samples outside its spin are not vector code (per-call work)";
  j["fma_shares"] = {{"zmm", fz / known}, {"ymm", fy / known}, {"xmm", fx / known}};
  j["path"] = path;
  j["summary"] = summary + ": " + path;
  return j;
}

json ProfilePeerKernels(pid_t pid, const std::string& work_dir, const std::function<void()>& run,
                        const std::string& library) {
  std::string so;
  {
    std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
    std::string line;
    while (std::getline(maps, line)) {
      const size_t at = line.find('/');
      if (at != std::string::npos && line.find(library) != std::string::npos) {
        so = line.substr(at);
        break;
      }
    }
  }
  if (so.empty()) return {{"error", library + " is not mapped in the peer"}};
  if (std::system("perf --version > /dev/null 2>&1") != 0 ||
      std::system("objdump --version > /dev/null 2>&1") != 0)
    return {{"error", "needs perf and objdump (Debian linux-perf, binutils)"}};
  const std::string data = work_dir + "/peer_kernels.perf";
  std::remove(data.c_str());
  pid_t perf = fork();
  if (perf < 0) return {{"error", "fork failed"}};
  if (perf == 0) {
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    const std::string p = std::to_string(pid);
    execlp("perf", "perf", "record", "-q", "-e", "cpu-clock", "-F", "4000", "-p", p.c_str(), "-o",
           data.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  usleep(200 * 1000);  // perf attaches
  run();
  kill(perf, SIGINT);
  int st = 0;
  waitpid(perf, &st, 0);
  const std::map<uint64_t, double> share = ParsePerfReport(
      Capture("perf report -i '" + data + "' --stdio --sort dso,sym 2>/dev/null"), library);
  if (share.empty())
    return {{"error",
             "perf recorded no samples in " + so + " (is perf_event_paranoid letting it attach?)"}};
  std::map<uint64_t, std::string> insn;
  for (const auto& [lo, hi] : SampleRanges(share)) {
    // From 64 bytes before the first sample, so it has the instructions before it too; x86
    // decoding started mid-instruction falls into step within a few instructions, and where it
    // has not by the first sampled address, from that address.
    std::map<uint64_t, std::string> d = Disassemble(so, lo >= 64 ? lo - 64 : lo, hi);
    bool aligned = true;
    for (auto it = share.lower_bound(lo); it != share.end() && it->first < hi; ++it)
      aligned = aligned && d.count(it->first);
    if (!aligned) d = Disassemble(so, lo, hi);
    insn.insert(d.begin(), d.end());
  }
  return ClassifySamples(share, insn, so);
}

}  // namespace kiln::bench
