// Tokenization throughput of `kiln data import text` at 1 and 2 threads (the scaling
// target: 1 -> 2 threads >= 1.7x), alternating runs, medians and their ratio. The tokenizer is
// trained once; each run then rewrites every shard (shards and their resume state are deleted
// between runs) and times the "tokenize and write" phase.
//
//   build/src/kiln/data/text_import_benchmark [--reps N] [--max-threads T] [CORPUS...]
//
// Without CORPUS files it generates a 6 MB multilingual corpus (German, Russian, Chinese and
// English words, '%'-separated documents). Run it on a quiet machine: on a shared one the ratio
// says more about the neighbours than about the code. It also prints what CPU time shows even on
// a busy machine: the process's CPU seconds per run at each thread count (equal when threads
// add no work) and the serial part (the calling thread outside the parallel loops), whose share
// of the 1-thread CPU time s bounds the speedup on T idle cores to 1 / (s + (1 - s) / T).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kiln/base/env.h"
#include "kiln/data/import/text_import.h"
#include "kiln/data/shard_io.h"

namespace {

std::string Corpus(size_t bytes) {
  const std::vector<std::string> words = {"Liebe", "Haus",  "Straße", "любовь", "дом",    "улица",
                                          "爱",    "房子",  "街道",   "the",    "house",  "street",
                                          "über",  "schön", "хорошо", "好",     "and",    "of",
                                          "Zeit",  "время", "时间",   "time",   "Wasser", "вода"};
  std::mt19937_64 rng(1);
  std::string out;
  while (out.size() < bytes) {
    const int lines = 1 + static_cast<int>(rng() % 4);
    for (int l = 0; l < lines; ++l) {
      const int n = 4 + static_cast<int>(rng() % 12);
      for (int w = 0; w < n; ++w) out += (w ? " " : "") + words[rng() % words.size()];
      out += ".\n";
    }
    out += "%\n";
  }
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln;
  int reps = 5, max_threads = 2;
  data::TextImportOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--max-threads" && i + 1 < argc) {
      max_threads = std::atoi(argv[++i]);
    } else {
      o.corpus.push_back(a);
    }
  }
  Env* env = Env::Default();
  char tmpl[] = "/tmp/text_import_benchmark.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;
  if (o.corpus.empty()) {
    o.corpus.push_back(JoinPath(dir, "corpus.txt"));
    if (!WriteStringToFile(env, Corpus(6 << 20), o.corpus[0]).ok()) return 1;
    o.doc_separator = "%";
  }
  o.out_dir = JoinPath(dir, "out");
  o.vocab_size = 2000;
  o.seq_len = 128;
  o.sample_lines = 20000;
  o.shards = 4;
  std::vector<std::vector<double>> secs(max_threads + 1), cpu(max_threads + 1),
      serial(max_threads + 1);
  int64_t tokens = 0;
  for (int rep = 0; rep <= reps; ++rep) {
    for (int t = 1; t <= max_threads; ++t) {
      absl::StatusOr<std::vector<std::string>> names = env->GetChildren(o.out_dir);
      for (const std::string& name : names.ok() ? *names : std::vector<std::string>{}) {
        if (name.size() > 9 && name.compare(name.size() - 9, 9, ".tfrecord") == 0) {
          (void)env->DeleteFile(JoinPath(o.out_dir, name));
          (void)env->DeleteFile(
              JoinPath(JoinPath(o.out_dir, data::kImportStateDir), name + ".json"));
        }
      }
      o.threads = t;
      absl::StatusOr<data::ImportSummary> s = data::ImportText(env, o);
      if (!s.ok()) {
        std::fprintf(stderr, "text_import_benchmark: %s\n",
                     std::string(s.status().message()).c_str());
        return 1;
      }
      tokens = s->units;
      if (rep == 0) continue;  // warm-up (and the tokenizer's training)
      for (const auto& [phase, sec] : s->phase_seconds) {
        if (phase == "tokenize and write") secs[t].push_back(sec);
      }
      cpu[t].push_back(s->tokenize_cpu_seconds);
      serial[t].push_back(s->tokenize_serial_cpu_seconds);
    }
  }
  std::printf("tokenize and write, %lld tokens, %d runs each (alternating):\n",
              static_cast<long long>(tokens), reps);
  for (int t = 1; t <= max_threads; ++t) {
    const double m = Median(secs[t]);
    std::printf(
        "  %d thread(s): median %.3f s (min %.3f, max %.3f), %.2f M tokens/s, %.2fx of 1 thread\n",
        t, m, *std::min_element(secs[t].begin(), secs[t].end()),
        *std::max_element(secs[t].begin(), secs[t].end()), tokens / m / 1e6, Median(secs[1]) / m);
  }
  std::printf("CPU time (median; hardly changed by other load on the machine):\n");
  const double c1 = Median(cpu[1]), s1 = Median(serial[1]);
  for (int t = 1; t <= max_threads; ++t) {
    std::printf("  %d thread(s): %.3f CPU s per run (%.2fx of 1 thread), serial part %.3f s\n", t,
                Median(cpu[t]), c1 > 0 ? Median(cpu[t]) / c1 : 0.0, Median(serial[t]));
  }
  const double share = c1 > 0 ? s1 / c1 : 0;
  std::printf("  serial share of the 1-thread CPU time %.2f%%: at most", 100 * share);
  for (int t = 2; t <= max_threads; ++t) {
    std::printf(" %.2fx on %d idle cores%s", 1 / (share + (1 - share) / t), t,
                t < max_threads ? "," : "");
  }
  std::printf(" (Amdahl)\n");
  (void)env->DeleteDir(dir);
  return 0;
}
