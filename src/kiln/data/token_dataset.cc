#include "kiln/data/token_dataset.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kiln/base/status.h"

namespace kiln::data {

absl::StatusOr<TokenDatasetInfo> TokenDatasetFromManifest(const DatasetManifest& m,
                                                          const std::string& dir) {
  const std::string where = JoinPath(dir, kManifestName);
  if (m.kind != "text") {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens:", dir, ": ", where, " is a dataset of kind '", m.kind,
                     "'; tokens: reads the token shards `kiln data import text` writes"));
  }
  TokenDatasetInfo t;
  try {
    const nlohmann::json& tok = m.extra.at("tokenizer");
    t.vocab_size = tok.at("vocab_size").get<int64_t>();
    t.tokenizer_model = JoinPath(dir, tok.value("model", std::string("tokenizer.model")));
    t.seq_len = m.extra.at("seq_len").get<int64_t>();
    if (m.extra.contains("languages")) {
      // Where each held-out shard's examples start in the held_out split (shards in order).
      std::map<std::string, int64_t> begin;
      int64_t at = 0;
      for (const ShardEntry& s : m.shards) {
        if (s.split != "held_out") continue;
        begin[s.file] = at;
        at += s.examples;
      }
      for (const nlohmann::json& l : m.extra.at("languages")) {
        TokenLanguage tl;
        tl.name = l.at("name").get<std::string>();
        const nlohmann::json& shards = l.at("held_out_shards");
        if (!shards.empty()) {
          const std::string file = shards.at(0).get<std::string>();
          auto it = begin.find(file);
          if (it == begin.end()) {
            return absl::DataLossError(absl::StrCat(where, ": language ", tl.name,
                                                    "'s held-out shard ", file,
                                                    " is not a held_out shard of the manifest"));
          }
          tl.held_out_begin = it->second;
          tl.held_out_examples = l.at("held_out_examples").get<int64_t>();
        }
        t.languages.push_back(std::move(tl));
      }
    }
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(where, ": malformed text manifest: ", e.what()));
  }
  if (t.vocab_size < 1 || t.seq_len < 1) {
    return absl::DataLossError(absl::StrCat(where, ": tokenizer vocab_size ", t.vocab_size,
                                            " and seq_len ", t.seq_len, " must be positive"));
  }
  return t;
}

absl::StatusOr<TokenDatasetInfo> ReadTokenDataset(Env* env, const std::string& dir) {
  KILN_ASSIGN_OR_RETURN(DatasetManifest m, ReadManifest(env, dir));
  return TokenDatasetFromManifest(m, dir);
}

absl::StatusOr<TokenLanguage> FindTokenLanguage(const DatasetManifest& m, const std::string& dir,
                                                const std::string& name) {
  KILN_ASSIGN_OR_RETURN(TokenDatasetInfo t, TokenDatasetFromManifest(m, dir));
  std::vector<std::string> names;
  for (const TokenLanguage& l : t.languages) {
    if (l.name == name) return l;
    names.push_back(l.name);
  }
  return absl::NotFoundError(absl::StrCat(
      "tokens:", dir, ": no language '", name, "' (",
      names.empty() ? std::string("not a multilingual import: import with --language-from-dir")
                    : "it has " + absl::StrJoin(names, ", "),
      ")"));
}

}  // namespace kiln::data
