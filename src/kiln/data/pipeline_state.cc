// The input pipeline's saved state: SaveState / RestoreState and the config a state must match
// (the JSON is specified in docs/formats.md "Dataset records and iterator state"). See pipeline.h.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kiln/data/internal/pipeline_impl.h"
#include "kiln/data/pipeline.h"
#include "nlohmann/json.hpp"

namespace kiln::data {
namespace {

using json = nlohmann::json;

constexpr char kStateFormat[] = "kiln.input_pipeline.v1";

}  // namespace

nlohmann::json InputPipeline::Impl::ConfigJson() const {
  json j{{"batch_size", config.batch_size},
         {"shuffle", config.shuffle},
         {"seed", config.seed},
         {"shuffle_buffer", config.shuffle_buffer},
         {"remainder", config.remainder},
         {"shard_index", config.shard_index},
         {"num_shards", config.num_shards},
         {"held_out_fraction", config.held_out_fraction},
         {"split", config.split},
         {"split_seed", config.split_seed}};
  // Only text sources read seq_len (kept out of the others' state, which predates it).
  if (config.source.rfind("text:", 0) == 0) j["seq_len"] = config.seq_len;
  if (config.augment.enabled()) j["augment"] = config.augment.ToJson();
  if (!config.language.empty()) j["language"] = config.language;
  return j;
}

std::string InputPipeline::SaveState() const {
  const Impl& m = *impl_;
  const int64_t pos = m.pos;
  json j = {{"format", kStateFormat},
            {"source", m.config.source},
            {"fingerprint", internal::Hex64(m.fingerprint)},
            {"config", m.ConfigJson()},
            {"epoch", m.epoch},
            {"batch_in_epoch", pos / m.config.batch_size},
            {"position_in_epoch", pos},
            {"examples_seen", m.seen},
            {"shard_index", m.config.shard_index},
            {"num_shards", m.config.num_shards},
            {"rng", {{"algorithm", "mt19937_64"}, {"seed", m.config.seed}, {"stream", m.epoch}}}};
  // Where the next batch starts reading (informational; restore recomputes it).
  if (!m.source->files().empty() && pos < m.M()) {
    std::vector<int64_t> order = m.ComputeOrder(m.epoch);
    auto [file, offset] = m.source->Location(order[pos]);
    j["next_record"] = {{"file", file}, {"offset", offset}};
  }
  return j.dump();
}

absl::Status InputPipeline::RestoreState(const std::string& text) {
  Impl& m = *impl_;
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("input pipeline state: ", why));
  };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  if (!j.contains("format") || j["format"] != kStateFormat)
    return bad(absl::StrCat("\"format\" is not \"", kStateFormat, "\""));
  for (const char* key : {"epoch", "batch_in_epoch", "examples_seen"})
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < 0)
      return bad(absl::StrCat("\"", key, "\" must be a non-negative integer"));
  if (!j.contains("fingerprint") || !j["fingerprint"].is_string() || !j.contains("config") ||
      !j["config"].is_object())
    return bad("missing \"fingerprint\" or \"config\"");
  if (j["fingerprint"].get<std::string>() != internal::Hex64(m.fingerprint))
    return absl::FailedPreconditionError(absl::StrCat(
        "input pipeline state was saved for different data (source ",
        (j.contains("source") && j["source"].is_string() ? j["source"].get<std::string>() : "?"),
        ", fingerprint ", j["fingerprint"].get<std::string>(), "); this pipeline reads ",
        m.config.source, " (fingerprint ", internal::Hex64(m.fingerprint), ")"));
  const json mine = m.ConfigJson();
  for (auto it = mine.begin(); it != mine.end(); ++it) {
    const json& theirs = j["config"];
    if (!theirs.contains(it.key()) || theirs[it.key()] != it.value())
      return absl::FailedPreconditionError(absl::StrCat(
          "input pipeline state was saved with data.", it.key(), " = ",
          theirs.contains(it.key()) ? theirs[it.key()].dump() : std::string("(missing)"),
          " but this pipeline has ", it.value().dump()));
  }
  int64_t pos = 0;
  if (m.wrap()) {  // batches do not line up with epochs: the position is in examples
    if (!j.contains("position_in_epoch") || !j["position_in_epoch"].is_number_integer() ||
        j["position_in_epoch"].get<int64_t>() < 0 || j["position_in_epoch"].get<int64_t>() >= m.M())
      return bad(absl::StrCat("\"position_in_epoch\" must be an integer in [0, ", m.M(), ")"));
    pos = j["position_in_epoch"].get<int64_t>();
  } else {
    const int64_t b = j["batch_in_epoch"].get<int64_t>();
    if (b >= m.bpe)
      return bad(absl::StrCat("batch_in_epoch ", b, " is past the ", m.bpe, " batches per epoch"));
    pos = b * m.config.batch_size;
  }
  m.StopThread();
  m.epoch = j["epoch"].get<int64_t>();
  m.pos = pos;
  m.seen = j["examples_seen"].get<int64_t>();
  m.sticky = absl::OkStatus();
  m.StartThread();
  return absl::OkStatus();
}

}  // namespace kiln::data
