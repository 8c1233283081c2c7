#include "kiln/data/import/text_import.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/base/crc32c.h"
#include "kiln/base/status.h"
#include "kiln/data/dataset.h"
#include "kiln/data/dataset_manifest.h"
#include "kiln/data/digits.h"
#include "kiln/data/example_proto.h"
#include "kiln/data/import/internal/sentencepiece_wrapper.h"
#include "kiln/data/shard_io.h"

namespace kiln::data {
namespace {

constexpr int kUnkId = 0, kBosId = 1, kEosId = 2, kPadId = 3;

double CpuSeconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// ParallelFor that adds the calling thread's CPU time inside it to *inside: what the calling
// thread spends outside every such loop is the import's serial part.
void TimedParallelFor(int threads, int64_t n, const std::function<void(int64_t)>& fn,
                      double* inside) {
  const double t0 = CpuSeconds(CLOCK_THREAD_CPUTIME_ID);
  ParallelFor(threads, n, fn);
  *inside += CpuSeconds(CLOCK_THREAD_CPUTIME_ID) - t0;
}

absl::Status CheckTextOptions(const TextImportOptions& o) {
  if (o.corpus.empty()) return absl::InvalidArgumentError("no corpus files given");
  if (o.out_dir.empty()) return absl::InvalidArgumentError("--out is required");
  if (o.vocab_size < 8 || o.vocab_size > 1000000)
    return absl::InvalidArgumentError("--vocab-size must be 8..1000000");
  if (o.seq_len < 1 || o.seq_len > 1 << 20)
    return absl::InvalidArgumentError("--seq-len must be 1..1048576");
  if (o.sample_lines < 1) return absl::InvalidArgumentError("--sample-lines must be at least 1");
  if (o.model_type != "unigram" && o.model_type != "bpe") {
    return absl::InvalidArgumentError("--model-type must be unigram or bpe, not '" + o.model_type +
                                      "'");
  }
  if (!(o.character_coverage > 0 && o.character_coverage <= 1)) {
    return absl::InvalidArgumentError("--character-coverage must be in (0, 1]");
  }
  if (o.doc_separator.empty())
    return absl::InvalidArgumentError("--doc-separator must not be empty");
  if (o.shards < 1 || o.shards > 99999)
    return absl::InvalidArgumentError("--shards must be 1..99999");
  if (!(o.held_out >= 0 && o.held_out < 1))
    return absl::InvalidArgumentError("--held-out must be in [0, 1)");
  return absl::OkStatus();
}

bool IsBlank(std::string_view line) {
  return line.find_first_not_of(" \t\f\v\r\n") == std::string_view::npos;
}

// Appends the documents of one file's text to *docs.
void SplitDocuments(std::string_view text, const std::string& sep, std::vector<std::string>* docs) {
  std::string cur;
  auto flush = [&] {
    while (!cur.empty() && cur.back() == '\n') cur.pop_back();
    if (!IsBlank(cur)) docs->push_back(std::move(cur));
    cur.clear();
  };
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    pos = end + 1;
    if (sep == "line") {
      cur.assign(line);
      flush();
    } else if ((sep == "blank" && IsBlank(line)) ||
               (sep != "blank" && sep != "file" && line == sep)) {
      flush();
    } else {
      cur.append(line);
      cur.push_back('\n');
    }
    if (end == text.size()) break;
  }
  flush();
}

// The non-empty lines of the documents, sampled as the header says.
std::vector<std::string> SampleLines(const std::vector<std::string>& docs, int64_t max_lines,
                                     uint64_t seed) {
  std::vector<std::string_view> lines;
  for (const std::string& d : docs) {
    size_t pos = 0;
    while (pos < d.size()) {
      size_t end = d.find('\n', pos);
      if (end == std::string::npos) end = d.size();
      std::string_view l(d.data() + pos, end - pos);
      if (!IsBlank(l)) lines.push_back(l);
      pos = end + 1;
    }
  }
  std::vector<int64_t> keep;
  const int64_t n = static_cast<int64_t>(lines.size());
  if (n <= max_lines) {
    for (int64_t i = 0; i < n; ++i) keep.push_back(i);
  } else {
    std::mt19937_64 rng(seed);
    std::vector<int64_t> perm = Permutation(n, rng);
    keep.assign(perm.begin(), perm.begin() + max_lines);
    std::sort(keep.begin(), keep.end());
  }
  std::vector<std::string> out;
  out.reserve(keep.size());
  for (int64_t i : keep) out.emplace_back(lines[i]);
  return out;
}

// Multilingual corpora: one language per folder.
struct LanguageInput {
  std::string name;
  std::string dir;
  std::vector<std::string> files;
  int64_t first_doc = 0, documents = 0;  // its documents are docs[first_doc, first_doc + documents)
};

bool ValidLanguageName(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  }
  return true;
}

// Every regular file under `path` (symlinks followed, names starting with '.' skipped), each
// folder's entries in sorted order.
absl::Status ListTree(Env* env, const std::string& path, std::vector<std::string>* out) {
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> names, env->GetChildren(path));
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    if (n.empty() || n[0] == '.') continue;
    const std::string p = JoinPath(path, n);
    KILN_ASSIGN_OR_RETURN(const bool is_dir, env->IsDirectory(p));
    if (is_dir) {
      KILN_RETURN_IF_ERROR(ListTree(env, p, out));
    } else {
      out->push_back(p);
    }
  }
  return absl::OkStatus();
}

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix.data(), suffix.size()) == 0;
}

// "DIR" or "LANG=DIR" entries to languages with their files (see text_import.h).
absl::StatusOr<std::vector<LanguageInput>> ListLanguages(Env* env,
                                                         const std::vector<std::string>& corpus) {
  std::vector<LanguageInput> langs;
  for (const std::string& entry : corpus) {
    LanguageInput l;
    const size_t eq = entry.find('=');
    if (eq != std::string::npos && eq > 0 && entry.find('/') > eq) {
      l.name = entry.substr(0, eq);
      l.dir = entry.substr(eq + 1);
    } else {
      l.dir = entry;
      std::string d = entry;
      while (d.size() > 1 && d.back() == '/') d.pop_back();
      l.name = Basename(d);
    }
    if (!ValidLanguageName(l.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--language-from-dir: '", entry, "' gives the language name '", l.name,
                       "': use letters, digits, '_' and '-' only (name it with LANG=DIR)"));
    }
    for (const LanguageInput& o : langs) {
      if (o.name == l.name) {
        return absl::InvalidArgumentError(absl::StrCat("--language-from-dir: language '", l.name,
                                                       "' is given twice (", o.dir, " and ", l.dir,
                                                       ")"));
      }
    }
    absl::StatusOr<bool> is_dir = env->IsDirectory(l.dir);
    if (!is_dir.ok() || !*is_dir) {
      return absl::InvalidArgumentError(
          absl::StrCat("--language-from-dir: ", l.dir,
                       " is not a folder (each corpus entry is one language's "
                       "folder)"));
    }
    std::vector<std::string> all;
    KILN_RETURN_IF_ERROR(ListTree(env, l.dir, &all));
    const std::set<std::string> present(all.begin(), all.end());
    for (const std::string& f : all) {
      if (EndsWith(f, ".dat")) continue;  // strfile's index of a fortune file
      // X and its UTF-8 copy X.u8: the copy is read, unless it is empty (bookworm's fortunes-pl
      // ships empty .u8 files beside UTF-8 originals).
      if (present.count(f + ".u8") > 0) {
        absl::StatusOr<uint64_t> u8 = env->GetFileSize(f + ".u8");
        if (u8.ok() && *u8 > 0) continue;
      }
      if (EndsWith(f, ".u8") && present.count(f.substr(0, f.size() - 3)) > 0) {
        absl::StatusOr<uint64_t> u8 = env->GetFileSize(f);
        if (u8.ok() && *u8 == 0) continue;
      }
      l.files.push_back(f);
    }
    if (l.files.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--language-from-dir: ", l.dir, " (language ",
                                                     l.name, ") holds no text files"));
    }
    langs.push_back(std::move(l));
  }
  return langs;
}

// The byte offset of the first byte that is not part of well-formed UTF-8, or -1.
int64_t FirstInvalidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const int64_t n = static_cast<int64_t>(s.size());
  for (int64_t i = 0; i < n;) {
    const unsigned char c = p[i];
    int len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (int k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return i;
    }
    i += len;
  }
  return -1;
}

// The tokenizer sample of a multilingual corpus: each language's share as text_import.h says.
std::vector<std::string> SampleLinesBalanced(const std::vector<std::string>& docs,
                                             const std::vector<LanguageInput>& langs,
                                             int64_t max_lines, uint64_t seed,
                                             std::vector<int64_t>* per_language) {
  const size_t nl = langs.size();
  std::vector<std::vector<std::string_view>> lines(nl);
  for (size_t k = 0; k < nl; ++k) {
    for (int64_t d = langs[k].first_doc; d < langs[k].first_doc + langs[k].documents; ++d) {
      const std::string& text = docs[d];
      size_t pos = 0;
      while (pos < text.size()) {
        size_t end = text.find('\n', pos);
        if (end == std::string::npos) end = text.size();
        std::string_view l(text.data() + pos, end - pos);
        if (!IsBlank(l)) lines[k].push_back(l);
        pos = end + 1;
      }
    }
  }
  // Water-filling: the smallest language first takes min(its lines, an equal share of what is
  // left); ties broken by language order, so the quotas are a pure function of the counts.
  std::vector<size_t> order(nl);
  for (size_t k = 0; k < nl; ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return lines[a].size() < lines[b].size(); });
  std::vector<int64_t> quota(nl, 0);
  int64_t left = max_lines;
  for (size_t i = 0; i < nl; ++i) {
    const size_t k = order[i];
    const int64_t share = left / static_cast<int64_t>(nl - i);
    quota[k] = std::min<int64_t>(static_cast<int64_t>(lines[k].size()), share);
    left -= quota[k];
  }
  std::vector<std::string> out;
  per_language->assign(nl, 0);
  for (size_t k = 0; k < nl; ++k) {
    const int64_t n = static_cast<int64_t>(lines[k].size());
    std::vector<int64_t> keep;
    if (quota[k] >= n) {
      for (int64_t i = 0; i < n; ++i) keep.push_back(i);
    } else {
      std::mt19937_64 rng(seed ^ (0x9E3779B97F4A7C15ull * (k + 1)));
      std::vector<int64_t> perm = Permutation(n, rng);
      keep.assign(perm.begin(), perm.begin() + quota[k]);
      std::sort(keep.begin(), keep.end());
    }
    (*per_language)[k] = static_cast<int64_t>(keep.size());
    for (int64_t i : keep) out.emplace_back(lines[k][i]);
  }
  return out;
}

// The split of a multilingual corpus (text_import.h): per language a seeded permutation, train
// documents of all languages cut into `shards` shards, one held-out shard per language.
// held_lang[i] is the language of plan shard i (-1 for train shards).
ShardPlan LanguagePlan(const std::vector<LanguageInput>& langs, double held_out, int shards,
                       uint64_t seed, std::vector<int>* held_lang) {
  std::vector<int64_t> train;
  std::vector<std::vector<int64_t>> held(langs.size());
  for (size_t k = 0; k < langs.size(); ++k) {
    const int64_t n = langs[k].documents;
    std::mt19937_64 rng(seed ^ (0xD1B54A32D192ED03ull * (k + 1)));
    const std::vector<int64_t> perm = Permutation(n, rng);
    int64_t n_held = std::llround(held_out * static_cast<double>(n));
    if (held_out > 0 && n >= 2) n_held = std::max<int64_t>(n_held, 1);
    for (int64_t i = 0; i < n; ++i) {
      (i < n_held ? held[k] : train).push_back(langs[k].first_doc + perm[i]);
    }
    std::sort(held[k].begin(), held[k].end());
  }
  std::sort(train.begin(), train.end());
  ShardPlan plan;
  const int64_t m = static_cast<int64_t>(train.size());
  const int count = ShardCount(m, shards, held_out, /*train=*/true);
  for (int k = 0; k < count; ++k) {
    plan.shards.push_back({ShardFileName("train", k, count), "train"});
    plan.items.emplace_back(train.begin() + k * m / count, train.begin() + (k + 1) * m / count);
    held_lang->push_back(-1);
  }
  int held_count = 0;
  for (const std::vector<int64_t>& h : held) held_count += h.empty() ? 0 : 1;
  int j = 0;
  for (size_t k = 0; k < langs.size(); ++k) {
    if (held[k].empty()) continue;
    plan.shards.push_back({ShardFileName("held_out", j++, held_count), "held_out"});
    plan.items.push_back(held[k]);
    held_lang->push_back(static_cast<int>(k));
  }
  return plan;
}

std::string VocabText(const internal::SentencePieceEncoder& sp) {
  std::string out;
  for (int i = 0; i < sp.vocab_size(); ++i)
    absl::StrAppend(&out, sp.Piece(i), "\t", sp.Score(i), "\n");
  return out;
}

absl::Status WriteAtomically(Env* env, const std::string& dir, const std::string& name,
                             const std::string& data) {
  const std::string tmp = JoinPath(dir, "." + name + ".tmp");
  KILN_RETURN_IF_ERROR(WriteStringToFile(env, data, tmp, /*sync=*/true));
  return env->RenameFile(tmp, JoinPath(dir, name));
}

// Trains (or keeps, when an earlier run of the same plan left it intact) DIR/tokenizer.model.
absl::StatusOr<std::string> Tokenizer(Env* env, const TextImportOptions& o,
                                      const std::vector<std::string>& docs,
                                      const std::vector<LanguageInput>& langs,
                                      const std::string& plan, int64_t* sample_size,
                                      std::vector<int64_t>* sample_by_language,
                                      const ProgressFn& progress) {
  const std::string model_path = JoinPath(o.out_dir, kTokenizerModel);
  const std::string state_path = JoinPath(JoinPath(o.out_dir, kImportStateDir), "tokenizer.json");
  if (env->FileExists(model_path) && env->FileExists(state_path)) {
    KILN_ASSIGN_OR_RETURN(std::string model, ReadFileToString(env, model_path));
    KILN_ASSIGN_OR_RETURN(std::string state_text, ReadFileToString(env, state_path));
    nlohmann::json st = nlohmann::json::parse(state_text, nullptr, false);
    if (!st.is_discarded() && st.value("plan", "") == plan &&
        st.value("crc32c", "") == Hex32(crc32c::Value(model.data(), model.size()))) {
      *sample_size = st.value("sample_lines", int64_t{0});
      if (st.contains("sample_lines_by_language") && st["sample_lines_by_language"].is_array()) {
        *sample_by_language = st["sample_lines_by_language"].get<std::vector<int64_t>>();
      }
      return model;
    }
  }
  std::vector<std::string> sample =
      langs.empty() ? SampleLines(docs, o.sample_lines, o.seed)
                    : SampleLinesBalanced(docs, langs, o.sample_lines, o.seed, sample_by_language);
  *sample_size = static_cast<int64_t>(sample.size());
  if (progress) progress({"train tokenizer", 0, 1, "models"});
  const std::vector<std::pair<std::string, std::string>> flags = {
      {"model_type", o.model_type},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"character_coverage", absl::StrCat(o.character_coverage)},
      {"hard_vocab_limit", "false"},  // a small corpus gets a smaller vocabulary, not an error
      {"num_threads", "1"},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"max_sentence_length", "65536"},
      {"unk_id", std::to_string(kUnkId)},
      {"bos_id", std::to_string(kBosId)},
      {"eos_id", std::to_string(kEosId)},
      {"pad_id", std::to_string(kPadId)},
      {"minloglevel", "2"},
  };
  std::string model;
  const std::string err = internal::TrainSentencePiece(flags, sample, &model);
  if (!err.empty()) return absl::InvalidArgumentError("SentencePiece training failed: " + err);
  if (progress) progress({"train tokenizer", 1, 1, "models"});
  std::string load_err;
  std::unique_ptr<internal::SentencePieceEncoder> sp =
      internal::SentencePieceEncoder::FromProto(model, &load_err);
  if (sp == nullptr)
    return absl::InternalError("the trained SentencePiece model does not load: " + load_err);
  KILN_RETURN_IF_ERROR(env->CreateDir(JoinPath(o.out_dir, kImportStateDir)));
  KILN_RETURN_IF_ERROR(WriteAtomically(env, o.out_dir, kTokenizerModel, model));
  KILN_RETURN_IF_ERROR(WriteAtomically(env, o.out_dir, kTokenizerVocab, VocabText(*sp)));
  nlohmann::json st = {{"plan", plan},
                       {"crc32c", Hex32(crc32c::Value(model.data(), model.size()))},
                       {"sample_lines", *sample_size}};
  if (!langs.empty()) st["sample_lines_by_language"] = *sample_by_language;
  KILN_RETURN_IF_ERROR(WriteStringToFile(env, st.dump() + "\n", state_path, /*sync=*/true));
  KILN_RETURN_IF_ERROR(env->SyncDir(o.out_dir));
  return model;
}

// Reads the corpus into documents; returns the source fingerprint (docs/formats.md).
// Multilingual corpora: *langs gets each language's files and documents, which are read language
// by language (docs of language k are contiguous) and must be UTF-8.
absl::StatusOr<uint64_t> ReadDocuments(Env* env, const TextImportOptions& o,
                                       std::vector<std::string>* docs,
                                       std::vector<LanguageInput>* langs, uint64_t* input_bytes) {
  uint64_t source_fp = Fnv1a64("text\n");
  std::vector<std::pair<int, std::string>> inputs;  // (language or -1, file)
  if (o.language_from_dir) {
    KILN_ASSIGN_OR_RETURN(*langs, ListLanguages(env, o.corpus));
    for (size_t k = 0; k < langs->size(); ++k) {
      for (const std::string& f : (*langs)[k].files) inputs.emplace_back(static_cast<int>(k), f);
    }
  } else {
    for (const std::string& path : o.corpus) inputs.emplace_back(-1, path);
  }
  int prev_lang = -1;
  for (const auto& [lang, path] : inputs) {
    KILN_ASSIGN_OR_RETURN(uint64_t size, env->GetFileSize(path));
    KILN_ASSIGN_OR_RETURN(std::string text, ReadMaybeGzippedFile(path, env));
    *input_bytes += size;
    std::string name = Basename(path);
    if (lang >= 0) {
      const int64_t bad = FirstInvalidUtf8(text);
      if (bad >= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": not UTF-8 at byte ", bad, " (language ", (*langs)[lang].name,
            "; convert it, e.g. iconv -f ISO-8859-2 -t UTF-8, or put its .u8 copy beside it)"));
      }
      // The language and the path within its folder (a file moved to another language is another
      // corpus).
      name = absl::StrCat((*langs)[lang].name, ":", path.substr((*langs)[lang].dir.size()));
      if (lang != prev_lang) (*langs)[lang].first_doc = static_cast<int64_t>(docs->size());
      prev_lang = lang;
    }
    const size_t before = docs->size();
    source_fp = Fnv1a64(
        absl::StrCat(name, "\t", size, "\t", Hex32(crc32c::Value(text.data(), text.size())), "\n"),
        source_fp);
    if (o.doc_separator == "file") {
      std::vector<std::string> one;
      SplitDocuments(text, "\x01no separator\x01", &one);  // whole file, blank-trimmed
      if (!one.empty()) {
        std::string joined;
        for (std::string& d : one) joined += d;
        docs->push_back(std::move(joined));
      }
    } else {
      SplitDocuments(text, o.doc_separator, docs);
    }
    if (lang >= 0) (*langs)[lang].documents += static_cast<int64_t>(docs->size() - before);
  }
  for (const LanguageInput& l : *langs) {
    if (l.documents == 0) {
      return absl::InvalidArgumentError(absl::StrCat("--language-from-dir: language ", l.name, " (",
                                                     l.dir, ") holds no non-empty documents"));
    }
  }
  return source_fp;
}

// The manifest, from every shard's state in plan order.
absl::StatusOr<DatasetManifest> TextManifest(const TextImportOptions& o,
                                             const std::vector<FinishedShard>& finished,
                                             const internal::SentencePieceEncoder& sp_ref,
                                             const std::string& source, uint64_t input_bytes,
                                             int64_t d, int64_t sample_size, uint32_t model_crc,
                                             int64_t window) {
  const internal::SentencePieceEncoder* sp = &sp_ref;
  DatasetManifest m;
  m.kind = "text";
  m.features = {{"tokens",
                 "int64",
                 {window},
                 "SentencePiece ids; inputs [0, seq_len), targets [1, seq_len]"}};
  nlohmann::json per_split = nlohmann::json::object();
  try {
    for (const FinishedShard& f : finished) {
      if (!per_split.contains(f.entry.split)) per_split[f.entry.split] = nlohmann::json::object();
      nlohmann::json& s = per_split[f.entry.split];
      for (const char* key : {"documents", "tokens", "dropped_tokens", "unk_tokens"}) {
        s[key] = s.value(key, int64_t{0}) + f.state.at(key).get<int64_t>();
      }
      m.shards.push_back(f.entry);
    }
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat("import state in ", o.out_dir, "/", kImportStateDir,
                                            " is malformed: ", e.what(), " (delete it and rerun)"));
  }
  m.statistics["tokens"] = per_split;
  m.source_fingerprint = source;
  m.source_files = static_cast<int64_t>(o.corpus.size());
  m.source_bytes = input_bytes;
  m.import_options = {{"corpus", o.corpus},
                      {"vocab_size", o.vocab_size},
                      {"seq_len", o.seq_len},
                      {"sample_lines", o.sample_lines},
                      {"model_type", o.model_type},
                      {"character_coverage", o.character_coverage},
                      {"doc_separator", o.doc_separator},
                      {"shards", o.shards},
                      {"held_out", o.held_out},
                      {"seed", o.seed}};
  m.extra["tokenizer"] = {{"model", kTokenizerModel},       {"vocab", kTokenizerVocab},
                          {"type", "sentencepiece"},        {"model_type", o.model_type},
                          {"vocab_size", sp->vocab_size()}, {"model_crc32c", Hex32(model_crc)},
                          {"unk_id", sp->unk_id()},         {"bos_id", sp->bos_id()},
                          {"eos_id", sp->eos_id()},         {"pad_id", sp->pad_id()},
                          {"sample_lines", sample_size}};
  m.extra["documents"] = d;
  m.extra["seq_len"] = o.seq_len;
  return m;
}

// Writes the windows of seq_len + 1 tokens starting every seq_len tokens of `stream` (encoded
// in parallel, in blocks, written in order); returns how many.
absl::StatusOr<int64_t> PackWindows(const std::vector<int64_t>& stream, int64_t seq_len,
                                    int threads, ShardWriter& w, double* parallel_cpu) {
  const int64_t tokens = static_cast<int64_t>(stream.size());
  const int64_t window = seq_len + 1;
  const int64_t records = tokens >= window ? (tokens - 1) / seq_len : 0;
  const int64_t rblock = 4096;
  std::vector<std::string> payloads(std::min(rblock, records));
  for (int64_t b = 0; b < records; b += rblock) {
    const int64_t n = std::min(rblock, records - b);
    TimedParallelFor(
        threads, n,
        [&](int64_t i) {
          const int64_t start = (b + i) * seq_len;
          Example ex;
          ex.features["tokens"] = Feature::Int64s(
              std::vector<int64_t>(stream.begin() + start, stream.begin() + start + window));
          payloads[i].clear();
          EncodeExampleTo(ex, &payloads[i]);
        },
        parallel_cpu);
    for (int64_t i = 0; i < n; ++i) KILN_RETURN_IF_ERROR(w.Write(payloads[i]));
  }
  return records;
}

// What tokenizing the shards of one import shares (TokenizeShard): the corpus, the tokenizer,
// the plan, and the progress and CPU time counted across shards.
struct TokenizeContext {
  const std::vector<std::string>& docs;
  const std::vector<std::vector<int64_t>>& shard_docs;
  const internal::SentencePieceEncoder& sp;
  int unk_id = 0;
  int64_t seq_len = 0;
  int threads = 1;
  int64_t d = 0;  // documents in all
  const ProgressFn& progress;
  std::thread::id caller;   // the thread that reports progress
  int64_t docs_done = 0;    // documents tokenized (or kept) so far
  double parallel_cpu = 0;  // the calling thread's CPU time inside the parallel loops
};

// Shard `index`: its documents tokenized, joined by EOS into one stream and packed into windows
// of seq_len + 1 tokens written to `w`; *state gets its counts.
absl::Status TokenizeShard(TokenizeContext& c, size_t index, ShardWriter& w,
                           nlohmann::json* state) {
  const std::vector<int64_t>& group = c.shard_docs[index];
  const int64_t g = static_cast<int64_t>(group.size());
  std::vector<std::vector<int>> ids(g);
  std::vector<std::string> errors(g);
  std::vector<int64_t> unk_of(g, 0);
  // One loop over the shard's documents (taken one at a time, so long and short documents
  // balance; no barrier until the shard is encoded); the calling thread reports progress.
  std::atomic<int64_t> encoded{0};
  const int64_t done_before = c.docs_done;
  TimedParallelFor(
      c.threads, g,
      [&](int64_t i) {
        errors[i] = c.sp.Encode(c.docs[group[i]], &ids[i]);
        for (int t : ids[i]) unk_of[i] += t == c.unk_id;
        const int64_t n = encoded.fetch_add(1, std::memory_order_relaxed) + 1;
        if (c.progress && (n & 255) == 0 && std::this_thread::get_id() == c.caller)
          c.progress({"tokenize", done_before + n, c.d, "documents"});
      },
      &c.parallel_cpu);
  c.docs_done += g;
  if (c.progress) c.progress({"tokenize", c.docs_done, c.d, "documents"});
  // The stream: every document's tokens then EOS, copied in parallel to offsets known ahead.
  std::vector<int64_t> start(g + 1, 0);
  int64_t unk = 0;
  for (int64_t i = 0; i < g; ++i) {
    if (!errors[i].empty())
      return absl::InternalError("SentencePiece could not encode a document: " + errors[i]);
    start[i + 1] = start[i] + static_cast<int64_t>(ids[i].size()) + 1;
    unk += unk_of[i];
  }
  std::vector<int64_t> stream(start[g]);
  TimedParallelFor(
      c.threads, g,
      [&](int64_t i) {
        std::copy(ids[i].begin(), ids[i].end(), stream.begin() + start[i]);
        stream[start[i + 1] - 1] = kEosId;
        std::vector<int>().swap(ids[i]);
      },
      &c.parallel_cpu);
  const int64_t tokens = static_cast<int64_t>(stream.size());
  KILN_ASSIGN_OR_RETURN(const int64_t records,
                        PackWindows(stream, c.seq_len, c.threads, w, &c.parallel_cpu));
  const int64_t used = records > 0 ? records * c.seq_len + 1 : 0;
  *state = {
      {"documents", g}, {"tokens", tokens}, {"dropped_tokens", tokens - used}, {"unk_tokens", unk}};
  return absl::OkStatus();
}

// dataset.json "languages" of a multilingual import: each language's inputs and its held-out
// shard's counts (held_lang: the language of each finished shard, -1 for train shards).
nlohmann::json LanguagesJson(const std::vector<LanguageInput>& langs,
                             const std::vector<int64_t>& sample_by_language,
                             const std::vector<FinishedShard>& finished,
                             const std::vector<int>& held_lang) {
  nlohmann::json list = nlohmann::json::array();
  for (size_t k = 0; k < langs.size(); ++k) {
    nlohmann::json l = {
        {"name", langs[k].name},
        {"dir", langs[k].dir},
        {"files", langs[k].files.size()},
        {"documents", langs[k].documents},
        {"sample_lines", k < sample_by_language.size() ? sample_by_language[k] : int64_t{0}},
        {"held_out_shards", nlohmann::json::array()},
        {"held_out_documents", 0},
        {"held_out_tokens", 0},
        {"held_out_examples", 0}};
    for (size_t i = 0; i < finished.size(); ++i) {
      if (held_lang[i] != static_cast<int>(k)) continue;
      l["held_out_shards"].push_back(finished[i].entry.file);
      l["held_out_documents"] = finished[i].state.value("documents", int64_t{0});
      l["held_out_tokens"] = finished[i].state.value("tokens", int64_t{0});
      l["held_out_examples"] = finished[i].entry.examples;
    }
    list.push_back(std::move(l));
  }
  return list;
}

}  // namespace

absl::StatusOr<ImportSummary> ImportText(Env* env, const TextImportOptions& o,
                                         const ProgressFn& progress) {
  KILN_RETURN_IF_ERROR(CheckTextOptions(o));
  ImportSummary summary;
  std::vector<std::string> docs;
  std::vector<LanguageInput> langs;
  KILN_ASSIGN_OR_RETURN(const uint64_t source_fp,
                        ReadDocuments(env, o, &docs, &langs, &summary.input_bytes));
  if (docs.empty())
    return absl::InvalidArgumentError("the corpus holds no text (no non-empty documents)");
  const std::string source = Hex64(source_fp);
  const std::string tok_plan = Hex64(Fnv1a64(absl::StrCat(
      source, "|", o.vocab_size, "|", o.model_type, "|", o.character_coverage, "|", o.sample_lines,
      "|", o.seed, "|", o.doc_separator, langs.empty() ? "" : "|balanced by language")));
  int64_t sample_size = 0;
  std::vector<int64_t> sample_by_language;
  auto t0 = std::chrono::steady_clock::now();
  auto lap = [&](const char* phase) {
    const auto now = std::chrono::steady_clock::now();
    summary.phase_seconds.emplace_back(phase, std::chrono::duration<double>(now - t0).count());
    t0 = now;
  };
  KILN_ASSIGN_OR_RETURN(std::string model, Tokenizer(env, o, docs, langs, tok_plan, &sample_size,
                                                     &sample_by_language, progress));
  std::string load_err;
  lap("tokenizer");
  std::unique_ptr<internal::SentencePieceEncoder> sp =
      internal::SentencePieceEncoder::FromProto(model, &load_err);
  if (sp == nullptr)
    return absl::DataLossError(
        absl::StrCat(o.out_dir, "/", kTokenizerModel, " does not load: ", load_err));
  const uint32_t model_crc = crc32c::Value(model.data(), model.size());

  // Split documents (each split in corpus order), then contiguous groups of them per shard.
  const int64_t d = static_cast<int64_t>(docs.size());
  std::vector<int> held_lang;  // multilingual: the language of each held-out shard
  const ShardPlan split = langs.empty()
                              ? PlanSplits(d, o.held_out, o.shards, o.seed, /*sorted=*/true)
                              : LanguagePlan(langs, o.held_out, o.shards, o.seed, &held_lang);
  const std::vector<PlannedShard>& plan = split.shards;
  const std::vector<std::vector<int64_t>>& shard_docs = split.items;
  const std::string plan_fp =
      Hex64(Fnv1a64(absl::StrCat(tok_plan, "|", Hex32(model_crc), "|", o.seq_len, "|", o.shards,
                                 "|", o.held_out, langs.empty() ? "" : "|split by language")));
  const int threads = ResolveThreads(o.threads);
  const int64_t window = o.seq_len + 1;

  const double cpu0 = CpuSeconds(CLOCK_PROCESS_CPUTIME_ID);
  const double main0 = CpuSeconds(CLOCK_THREAD_CPUTIME_ID);
  TokenizeContext tc{docs,
                     shard_docs,
                     *sp,
                     sp->unk_id(),
                     o.seq_len,
                     threads,
                     d,
                     progress,
                     std::this_thread::get_id()};
  auto produce = [&](size_t index, ShardWriter& w, nlohmann::json* state) {
    return TokenizeShard(tc, index, w, state);
  };
  double sync_seconds = 0;
  KILN_ASSIGN_OR_RETURN(std::vector<FinishedShard> finished,
                        WriteShards(
                            env, o.out_dir, plan_fp, plan, produce, &summary.shards_kept,
                            [&](size_t i) {
                              tc.docs_done += static_cast<int64_t>(shard_docs[i].size());
                              if (progress) progress({"tokenize", tc.docs_done, d, "documents"});
                            },
                            &sync_seconds));

  lap("tokenize and write");
  summary.tokenize_cpu_seconds = CpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
  summary.tokenize_serial_cpu_seconds =
      CpuSeconds(CLOCK_THREAD_CPUTIME_ID) - main0 - tc.parallel_cpu;
  summary.phase_seconds.back().second -= sync_seconds;
  summary.phase_seconds.emplace_back("fsync shards", sync_seconds);
  KILN_ASSIGN_OR_RETURN(DatasetManifest m,
                        TextManifest(o, finished, *sp, source, summary.input_bytes, d, sample_size,
                                     model_crc, window));
  if (!langs.empty()) {
    m.extra["languages"] = LanguagesJson(langs, sample_by_language, finished, held_lang);
    m.import_options["language_from_dir"] = true;
  }
  if (!langs.empty()) m.source_files = 0;
  for (const LanguageInput& l : langs) m.source_files += static_cast<int64_t>(l.files.size());
  KILN_RETURN_IF_ERROR(WriteManifest(env, o.out_dir, m));
  summary.shards = static_cast<int>(m.shards.size());
  summary.splits = m.SplitExamples();
  for (const auto& [split, k] : summary.splits) summary.examples += k;
  for (const auto& [split, st] : m.statistics["tokens"].items()) {
    summary.units += st.value("tokens", int64_t{0});
  }
  return summary;
}

}  // namespace kiln::data
