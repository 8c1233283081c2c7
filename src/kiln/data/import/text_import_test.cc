#include "kiln/data/import/text_import.h"

#include <map>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "kiln/base/env.h"
#include "kiln/data/dataset_manifest.h"
#include "kiln/data/import/internal/sentencepiece_wrapper.h"
#include "kiln/data/shard_io.h"
#include "tests/support/temp_dir.h"

namespace kiln::data {
namespace {

// A fortune-style file ("%" lines between documents) of words in three scripts.
std::string Corpus(uint64_t seed, int docs) {
  const std::vector<std::string> words = {"Liebe", "Haus",  "Straße", "любовь", "дом",   "улица",
                                          "爱",    "房子",  "街道",   "the",    "house", "street",
                                          "über",  "schön", "хорошо", "好",     "and",   "of"};
  std::mt19937_64 rng(seed);
  std::string out;
  for (int d = 0; d < docs; ++d) {
    const int lines = 1 + static_cast<int>(rng() % 3);
    for (int l = 0; l < lines; ++l) {
      const int n = 3 + static_cast<int>(rng() % 8);
      for (int w = 0; w < n; ++w) out += (w ? " " : "") + words[rng() % words.size()];
      out += l % 2 ? ".\r\n" : ".\n";
    }
    out += "%\n";
  }
  return out;
}

std::map<std::string, std::string> DirFiles(Env* env, const std::string& dir) {
  std::map<std::string, std::string> out;
  const std::vector<std::string> names = *env->GetChildren(dir);
  for (const std::string& name : names) {
    if (name[0] != '.') out[name] = *ReadFileToString(env, JoinPath(dir, name));
  }
  return out;
}

TEST(TextImport, TokenizerShardsPackingAndDeterminism) {
  Env* env = Env::Default();
  const std::string tmp = test_support::MakeTempDir("text_import_test");
  const std::string a = JoinPath(tmp, "a.txt"), b = JoinPath(tmp, "b.txt");
  ASSERT_TRUE(WriteStringToFile(env, Corpus(1, 300), a).ok());
  ASSERT_TRUE(WriteStringToFile(env, Corpus(2, 200), b).ok());
  TextImportOptions o;
  o.corpus = {a, b};
  o.vocab_size = 120;
  o.seq_len = 16;
  o.sample_lines = 400;
  o.doc_separator = "%";
  o.shards = 3;
  o.held_out = 0.1;
  std::vector<std::map<std::string, std::string>> runs;
  for (int threads : {1, 2}) {
    o.threads = threads;
    o.out_dir = JoinPath(tmp, "out" + std::to_string(threads));
    absl::StatusOr<ImportSummary> s = ImportText(env, o);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->shards, 4);
    EXPECT_GT(s->units, 1000);
    runs.push_back(DirFiles(env, o.out_dir));
  }
  EXPECT_EQ(runs[0], runs[1]);
  ASSERT_TRUE(runs[0].count("tokenizer.model"));
  ASSERT_TRUE(runs[0].count("tokenizer.vocab"));

  absl::StatusOr<DatasetManifest> m = ReadManifest(env, o.out_dir);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->FindFeature("tokens")->shape, (std::vector<int64_t>{17}));
  EXPECT_EQ(m->extra["documents"], 500);
  EXPECT_EQ(m->extra["tokenizer"]["eos_id"], 2);
  const int vocab = m->extra["tokenizer"]["vocab_size"];
  EXPECT_LE(vocab, 120);
  EXPECT_EQ(m->statistics["tokens"]["train"]["documents"].get<int64_t>() +
                m->statistics["tokens"]["held_out"]["documents"].get<int64_t>(),
            500);
  // The vocab file has one line per piece; the model loads and round-trips text.
  const std::string& vocab_text = runs[0]["tokenizer.vocab"];
  EXPECT_EQ(std::count(vocab_text.begin(), vocab_text.end(), '\n'), vocab);
  std::string err;
  auto sp = internal::SentencePieceEncoder::FromProto(runs[0]["tokenizer.model"], &err);
  ASSERT_NE(sp, nullptr) << err;
  std::vector<int> ids;
  EXPECT_EQ(sp->Encode("Liebe дом 爱", &ids), "");
  EXPECT_FALSE(ids.empty());

  // Windows of 17 tokens advancing by 16: consecutive records share a token; EOS separates docs.
  int64_t records = 0, eos = 0;
  for (const ShardEntry& e : m->shards) {
    auto r = ExampleReader::Open(env, JoinPath(o.out_dir, e.file));
    ASSERT_TRUE(r.ok());
    Example ex;
    std::vector<int64_t> prev;
    while (*(*r)->Next(&ex)) {
      const std::vector<int64_t>& t = ex.features["tokens"].int64_list;
      ASSERT_EQ(t.size(), 17u);
      for (int64_t id : t) ASSERT_TRUE(id >= 0 && id < vocab);
      if (!prev.empty()) {
        EXPECT_EQ(prev.back(), t.front());
      }
      for (size_t i = 1; i < t.size(); ++i) eos += t[i] == 2;
      prev = t;
      ++records;
    }
  }
  EXPECT_EQ(records, m->SplitExamples()["train"] + m->SplitExamples()["held_out"]);
  EXPECT_GT(eos, 400);

  // A rerun keeps the tokenizer and every shard.
  absl::StatusOr<ImportSummary> again = ImportText(env, o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->shards_kept, again->shards);
  EXPECT_EQ(DirFiles(env, o.out_dir), runs[1]);
}

TEST(TextImport, DocumentSeparatorsAndErrors) {
  Env* env = Env::Default();
  const std::string tmp = test_support::MakeTempDir("text_import_test");
  const std::string a = JoinPath(tmp, "a.txt");
  ASSERT_TRUE(WriteStringToFile(env, Corpus(3, 80), a).ok());
  TextImportOptions o;
  o.corpus = {a};
  o.out_dir = JoinPath(tmp, "out");
  o.vocab_size = 60;
  o.seq_len = 8;
  o.shards = 1;
  o.held_out = 0;
  for (const char* sep : {"line", "blank", "file"}) {
    o.doc_separator = sep;
    absl::StatusOr<ImportSummary> s = ImportText(env, o);
    ASSERT_TRUE(s.ok()) << sep << ": " << s.status();
    absl::StatusOr<DatasetManifest> m = ReadManifest(env, o.out_dir);
    const int64_t docs = m->extra["documents"];
    if (std::string(sep) == "file" || std::string(sep) == "blank") {
      EXPECT_EQ(docs, 1) << sep;
    } else {
      EXPECT_GT(docs, 80) << sep;  // each line (the "%" lines too)
    }
  }
  o.corpus = {JoinPath(tmp, "missing.txt")};
  absl::Status st = ImportText(env, o).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(st.message().find("missing.txt"), std::string::npos);
  const std::string empty = JoinPath(tmp, "empty.txt");
  ASSERT_TRUE(WriteStringToFile(env, "\n\n  \n", empty).ok());
  o.corpus = {empty};
  EXPECT_NE(ImportText(env, o).status().message().find("no text"), std::string::npos);
  o.corpus = {a};
  o.seq_len = 0;
  EXPECT_NE(ImportText(env, o).status().message().find("--seq-len"), std::string::npos);
}

}  // namespace
}  // namespace kiln::data

namespace kiln::data {
namespace {

// One language folder per language: "%"-separated documents of that language's words.
std::string LanguageText(const std::vector<std::string>& words, uint64_t seed, int docs) {
  std::mt19937_64 rng(seed);
  std::string out;
  for (int d = 0; d < docs; ++d) {
    const int lines = 1 + static_cast<int>(rng() % 3);
    for (int l = 0; l < lines; ++l) {
      const int n = 3 + static_cast<int>(rng() % 6);
      for (int w = 0; w < n; ++w) out += (w ? " " : "") + words[rng() % words.size()];
      out += ".\n";
    }
    out += "%\n";
  }
  return out;
}

// de/ (with a .dat index and an ISO-8859-2 file with its .u8 copy), ru/ (two files in a
// subfolder), zh/ (a few lines only).
std::string MakeMultilingualCorpus(Env* env, const std::string& root) {
  const std::string de = JoinPath(root, "de"), ru = JoinPath(root, "ru"), zh = JoinPath(root, "zh");
  for (const std::string& d : {root, de, ru, JoinPath(ru, "sub"), zh})
    EXPECT_TRUE(env->CreateDir(d).ok());
  const std::vector<std::string> de_words = {"Liebe", "Haus", "Straße", "über", "schön", "Zeit"};
  const std::vector<std::string> ru_words = {"любовь", "дом", "улица", "хорошо", "время"};
  EXPECT_TRUE(WriteStringToFile(env, LanguageText(de_words, 1, 120), JoinPath(de, "a")).ok());
  EXPECT_TRUE(
      WriteStringToFile(env, std::string("\x00\xff\xfe binary index", 17), JoinPath(de, "a.dat"))
          .ok());
  // "Żółw" in ISO-8859-2 (not UTF-8), and its UTF-8 copy, which is read instead.
  EXPECT_TRUE(WriteStringToFile(env, "\xaf\xf3\xb3w\n%\n", JoinPath(de, "b")).ok());
  EXPECT_TRUE(WriteStringToFile(env, LanguageText(de_words, 2, 30), JoinPath(de, "b.u8")).ok());
  EXPECT_TRUE(WriteStringToFile(env, LanguageText(ru_words, 3, 80), JoinPath(ru, "x")).ok());
  EXPECT_TRUE(WriteStringToFile(env, "", JoinPath(ru, "x.u8")).ok());  // empty: x is read
  EXPECT_TRUE(
      WriteStringToFile(env, LanguageText(ru_words, 4, 40), JoinPath(JoinPath(ru, "sub"), "y"))
          .ok());
  EXPECT_TRUE(WriteStringToFile(env,
                                "爱 房子 街道。\n%\n好 时间。\n%\n房子 爱。\n%\n街道 好 爱。\n%\n",
                                JoinPath(zh, "z"))
                  .ok());
  return root;
}

TEST(TextImport, LanguageFoldersBalancedSampleAndPerLanguageHeldOut) {
  Env* env = Env::Default();
  const std::string tmp = test_support::MakeTempDir("text_import_lang");
  const std::string root = MakeMultilingualCorpus(env, JoinPath(tmp, "corpus"));
  TextImportOptions o;
  o.corpus = {JoinPath(root, "de"), JoinPath(root, "ru"), "chinese=" + JoinPath(root, "zh")};
  o.language_from_dir = true;
  o.vocab_size = 80;
  o.seq_len = 4;
  o.sample_lines = 60;
  o.doc_separator = "%";
  o.shards = 2;
  o.held_out = 0.1;
  std::vector<std::map<std::string, std::string>> runs;
  for (int threads : {1, 2}) {
    o.threads = threads;
    o.out_dir = JoinPath(tmp, "out" + std::to_string(threads));
    absl::StatusOr<ImportSummary> s = ImportText(env, o);
    ASSERT_TRUE(s.ok()) << s.status();
    runs.push_back(DirFiles(env, o.out_dir));
  }
  EXPECT_EQ(runs[0], runs[1]);  // deterministic whatever the thread count
  absl::StatusOr<DatasetManifest> m = ReadManifest(env, o.out_dir);
  ASSERT_TRUE(m.ok()) << m.status();
  const nlohmann::json& langs = m->extra["languages"];
  ASSERT_EQ(langs.size(), 3u);
  EXPECT_EQ(langs[0]["name"], "de");
  EXPECT_EQ(langs[1]["name"], "ru");
  EXPECT_EQ(langs[2]["name"], "chinese");
  EXPECT_EQ(langs[0]["files"], 2);  // a and b.u8: not a.dat, not the ISO-8859-2 b
  EXPECT_EQ(langs[1]["files"], 2);  // x (its .u8 copy is empty) and sub/y, at any depth
  EXPECT_EQ(langs[0]["documents"], 150);
  EXPECT_EQ(langs[1]["documents"], 120);
  EXPECT_EQ(langs[2]["documents"], 4);
  // Water-filling: zh has 4 lines (its share 60 / 3 = 20), then de and ru split the other 56.
  EXPECT_EQ(langs[2]["sample_lines"], 4);
  EXPECT_EQ(langs[0]["sample_lines"].get<int64_t>() + langs[1]["sample_lines"].get<int64_t>(), 56);
  EXPECT_EQ(langs[0]["sample_lines"], 28);
  // One held-out shard per language, the documents of that language only.
  int64_t held_docs = 0;
  for (const nlohmann::json& l : langs) {
    ASSERT_EQ(l["held_out_shards"].size(), 1u) << l.dump();
    EXPECT_GE(l["held_out_documents"].get<int64_t>(), 1);
    held_docs += l["held_out_documents"].get<int64_t>();
  }
  EXPECT_EQ(langs[0]["held_out_documents"], 15);
  EXPECT_EQ(langs[1]["held_out_documents"], 12);
  EXPECT_EQ(langs[2]["held_out_documents"], 1);  // at least one per language
  EXPECT_EQ(m->statistics["tokens"]["held_out"]["documents"], held_docs);
  EXPECT_EQ(m->statistics["tokens"]["train"]["documents"], 274 - held_docs);
  int train_shards = 0, held_shards = 0;
  for (const ShardEntry& e : m->shards) (e.split == "train" ? train_shards : held_shards)++;
  EXPECT_EQ(train_shards, 2);
  EXPECT_EQ(held_shards, 3);
  // The Chinese held-out shard holds only Chinese pieces: every id decodes to CJK or specials.
  std::string err;
  auto sp = internal::SentencePieceEncoder::FromProto(runs[1]["tokenizer.model"], &err);
  ASSERT_NE(sp, nullptr) << err;
  std::vector<int> ids;
  EXPECT_EQ(sp->Encode("Liebe дом 爱", &ids), "");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), sp->unk_id()), 0);  // every script in the vocabulary

  // A rerun keeps everything.
  absl::StatusOr<ImportSummary> again = ImportText(env, o);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->shards_kept, again->shards);
}

TEST(TextImport, LanguageFolderErrors) {
  Env* env = Env::Default();
  const std::string tmp = test_support::MakeTempDir("text_import_lang_err");
  const std::string root = MakeMultilingualCorpus(env, JoinPath(tmp, "corpus"));
  TextImportOptions o;
  o.language_from_dir = true;
  o.out_dir = JoinPath(tmp, "out");
  o.vocab_size = 60;
  o.seq_len = 4;
  o.doc_separator = "%";
  // Not UTF-8 and no .u8 copy: named with the byte offset.
  ASSERT_TRUE(env->DeleteFile(JoinPath(JoinPath(root, "de"), "b.u8")).ok());
  o.corpus = {JoinPath(root, "de")};
  absl::Status st = ImportText(env, o).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("/de/b: not UTF-8 at byte 0"), std::string::npos) << st;
  o.corpus = {JoinPath(root, "ru"), JoinPath(root, "ru")};
  EXPECT_NE(ImportText(env, o).status().message().find("language 'ru' is given twice"),
            std::string::npos);
  o.corpus = {JoinPath(JoinPath(root, "ru"), "x")};
  EXPECT_NE(ImportText(env, o).status().message().find("is not a folder"), std::string::npos);
  o.corpus = {"a b=" + JoinPath(root, "ru")};
  EXPECT_NE(ImportText(env, o).status().message().find("letters, digits"), std::string::npos);
}

}  // namespace
}  // namespace kiln::data
