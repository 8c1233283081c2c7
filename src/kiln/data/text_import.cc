#include "kiln/data/text_import.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/base/crc32c.h"
#include "kiln/base/status.h"
#include "kiln/data/dataset.h"
#include "kiln/data/dataset_manifest.h"
#include "kiln/data/digits.h"
#include "kiln/data/example_proto.h"
#include "kiln/data/internal/sentencepiece_wrapper.h"
#include "kiln/data/shard_io.h"

namespace kiln::data {
namespace {

constexpr int kUnkId = 0, kBosId = 1, kEosId = 2, kPadId = 3;

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
                                      const std::vector<std::string>& docs, const std::string& plan,
                                      int64_t* sample_size, const ProgressFn& progress) {
  const std::string model_path = JoinPath(o.out_dir, kTokenizerModel);
  const std::string state_path = JoinPath(JoinPath(o.out_dir, kImportStateDir), "tokenizer.json");
  if (env->FileExists(model_path) && env->FileExists(state_path)) {
    KILN_ASSIGN_OR_RETURN(std::string model, ReadFileToString(env, model_path));
    KILN_ASSIGN_OR_RETURN(std::string state_text, ReadFileToString(env, state_path));
    nlohmann::json st = nlohmann::json::parse(state_text, nullptr, false);
    if (!st.is_discarded() && st.value("plan", "") == plan &&
        st.value("crc32c", "") == Hex32(crc32c::Value(model.data(), model.size()))) {
      *sample_size = st.value("sample_lines", int64_t{0});
      return model;
    }
  }
  std::vector<std::string> sample = SampleLines(docs, o.sample_lines, o.seed);
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
  KILN_RETURN_IF_ERROR(WriteStringToFile(env, st.dump() + "\n", state_path, /*sync=*/true));
  KILN_RETURN_IF_ERROR(env->SyncDir(o.out_dir));
  return model;
}

// Reads the corpus into documents; returns the source fingerprint (docs/formats.md).
absl::StatusOr<uint64_t> ReadDocuments(Env* env, const TextImportOptions& o,
                                       std::vector<std::string>* docs, uint64_t* input_bytes) {
  uint64_t source_fp = Fnv1a64("text\n");
  for (const std::string& path : o.corpus) {
    KILN_ASSIGN_OR_RETURN(uint64_t size, env->GetFileSize(path));
    KILN_ASSIGN_OR_RETURN(std::string text, ReadMaybeGzippedFile(path, env));
    *input_bytes += size;
    source_fp = Fnv1a64(absl::StrCat(Basename(path), "\t", size, "\t",
                                     Hex32(crc32c::Value(text.data(), text.size())), "\n"),
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
                                    int threads, ShardWriter& w) {
  const int64_t tokens = static_cast<int64_t>(stream.size());
  const int64_t window = seq_len + 1;
  const int64_t records = tokens >= window ? (tokens - 1) / seq_len : 0;
  const int64_t rblock = 4096;
  std::vector<std::string> payloads(std::min(rblock, records));
  for (int64_t b = 0; b < records; b += rblock) {
    const int64_t n = std::min(rblock, records - b);
    ParallelFor(threads, n, [&](int64_t i) {
      const int64_t start = (b + i) * seq_len;
      Example ex;
      ex.features["tokens"] = Feature::Int64s(
          std::vector<int64_t>(stream.begin() + start, stream.begin() + start + window));
      payloads[i].clear();
      EncodeExampleTo(ex, &payloads[i]);
    });
    for (int64_t i = 0; i < n; ++i) KILN_RETURN_IF_ERROR(w.Write(payloads[i]));
  }
  return records;
}

}  // namespace

absl::StatusOr<ImportSummary> ImportText(Env* env, const TextImportOptions& o,
                                         const ProgressFn& progress) {
  KILN_RETURN_IF_ERROR(CheckTextOptions(o));
  ImportSummary summary;
  std::vector<std::string> docs;
  KILN_ASSIGN_OR_RETURN(const uint64_t source_fp,
                        ReadDocuments(env, o, &docs, &summary.input_bytes));
  if (docs.empty())
    return absl::InvalidArgumentError("the corpus holds no text (no non-empty documents)");
  const std::string source = Hex64(source_fp);
  const std::string tok_plan = Hex64(
      Fnv1a64(absl::StrCat(source, "|", o.vocab_size, "|", o.model_type, "|", o.character_coverage,
                           "|", o.sample_lines, "|", o.seed, "|", o.doc_separator)));
  int64_t sample_size = 0;
  auto t0 = std::chrono::steady_clock::now();
  auto lap = [&](const char* phase) {
    const auto now = std::chrono::steady_clock::now();
    summary.phase_seconds.emplace_back(phase, std::chrono::duration<double>(now - t0).count());
    t0 = now;
  };
  KILN_ASSIGN_OR_RETURN(std::string model,
                        Tokenizer(env, o, docs, tok_plan, &sample_size, progress));
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
  const ShardPlan split = PlanSplits(d, o.held_out, o.shards, o.seed, /*sorted=*/true);
  const std::vector<PlannedShard>& plan = split.shards;
  const std::vector<std::vector<int64_t>>& shard_docs = split.items;
  const std::string plan_fp = Hex64(Fnv1a64(absl::StrCat(
      tok_plan, "|", Hex32(model_crc), "|", o.seq_len, "|", o.shards, "|", o.held_out)));
  const int threads = ResolveThreads(o.threads);
  const int64_t window = o.seq_len + 1;

  int64_t docs_done = 0;
  auto produce = [&](size_t index, ShardWriter& w, nlohmann::json* state) -> absl::Status {
    const std::vector<int64_t>& group = shard_docs[index];
    const int64_t g = static_cast<int64_t>(group.size());
    std::vector<std::vector<int>> ids(g);
    std::vector<std::string> errors(g);
    const int64_t block = std::max<int64_t>(256, g / 20);
    for (int64_t b = 0; b < g; b += block) {
      const int64_t n = std::min(block, g - b);
      ParallelFor(threads, n,
                  [&](int64_t i) { errors[b + i] = sp->Encode(docs[group[b + i]], &ids[b + i]); });
      docs_done += n;
      if (progress) progress({"tokenize", docs_done, d, "documents"});
    }
    std::vector<int64_t> stream;
    int64_t unk = 0;
    for (int64_t i = 0; i < g; ++i) {
      if (!errors[i].empty())
        return absl::InternalError("SentencePiece could not encode a document: " + errors[i]);
      for (int t : ids[i]) {
        stream.push_back(t);
        unk += t == sp->unk_id();
      }
      stream.push_back(kEosId);
    }
    const int64_t tokens = static_cast<int64_t>(stream.size());
    KILN_ASSIGN_OR_RETURN(const int64_t records, PackWindows(stream, o.seq_len, threads, w));
    const int64_t used = records > 0 ? records * o.seq_len + 1 : 0;
    *state = {{"documents", g},
              {"tokens", tokens},
              {"dropped_tokens", tokens - used},
              {"unk_tokens", unk}};
    return absl::OkStatus();
  };
  double sync_seconds = 0;
  KILN_ASSIGN_OR_RETURN(std::vector<FinishedShard> finished,
                        WriteShards(
                            env, o.out_dir, plan_fp, plan, produce, &summary.shards_kept,
                            [&](size_t i) {
                              docs_done += static_cast<int64_t>(shard_docs[i].size());
                              if (progress) progress({"tokenize", docs_done, d, "documents"});
                            },
                            &sync_seconds));

  lap("tokenize and write");
  summary.phase_seconds.back().second -= sync_seconds;
  summary.phase_seconds.emplace_back("fsync shards", sync_seconds);
  KILN_ASSIGN_OR_RETURN(DatasetManifest m,
                        TextManifest(o, finished, *sp, source, summary.input_bytes, d, sample_size,
                                     model_crc, window));
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
