#include "kiln/data/import/labeled_import.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kiln/base/crc32c.h"
#include "kiln/base/log.h"
#include "kiln/base/status.h"
#include "kiln/data/example_proto.h"
#include "kiln/data/shard_io.h"

namespace kiln::data {

LabeledDecode DecodeLabeledFile(Env* env, const std::string& src_dir, const std::string& rel,
                                int channels, int64_t label, const std::string& path,
                                const PixelDecoder& pixels) {
  LabeledDecode d;
  d.stats = ChannelStats(channels);
  absl::StatusOr<std::string> bytes = ReadFileToString(env, JoinPath(src_dir, rel));
  if (!bytes.ok()) {
    d.error = std::string(bytes.status().message());
    return d;
  }
  d.crc = crc32c::Value(bytes->data(), bytes->size());
  absl::StatusOr<std::vector<uint8_t>> px = pixels(*bytes);
  if (!px.ok()) {
    d.error = std::string(px.status().message());
    return d;
  }
  d.stats.Add(px->data(), static_cast<int64_t>(px->size()));
  Example ex;
  ex.features["image"] = Feature::Bytes({std::string(px->begin(), px->end())});
  ex.features["label"] = Feature::Int64s({label});
  ex.features["path"] = Feature::Bytes({path});
  d.payload = EncodeExample(ex);
  return d;
}

void LabeledShards::FillManifest(DatasetManifest* m) const {
  m->shards = shards;
  for (const auto& s : skipped) m->skipped.push_back(s);
  m->statistics["image"] = stats.Summary();
  m->statistics["label"] = {{"counts", label_counts}};
}

absl::StatusOr<LabeledShards> WriteLabeledShards(Env* env, const LabeledImport& li,
                                                 const ProgressFn& progress) {
  const ShardPlan split = PlanSplits(li.items, li.held_out, li.shards, li.seed);
  int64_t done = 0;
  auto report = [&] {
    if (progress) progress({"decode", done, li.items, "images"});
  };
  auto produce = [&](size_t index, ShardWriter& w, nlohmann::json* state) -> absl::Status {
    const std::vector<int64_t>& items = split.items[index];
    ChannelStats stats(li.channels);
    std::vector<int64_t> label_counts(li.num_labels, 0);
    nlohmann::json crcs = nlohmann::json::object(), skipped = nlohmann::json::array();
    const int64_t block = li.block_per_thread * li.threads;
    for (int64_t b = 0; b < static_cast<int64_t>(items.size()); b += block) {
      const int64_t n = std::min<int64_t>(block, items.size() - b);
      std::vector<LabeledDecode> out(n);
      ParallelFor(li.threads, n, [&](int64_t i) { out[i] = li.decode(items[b + i]); });
      for (int64_t i = 0; i < n; ++i) {
        const int64_t item = items[b + i];
        const std::string key = li.key(item);
        crcs[key] = out[i].crc;
        if (!out[i].error.empty()) {
          if (li.on_error == "fail") {
            return absl::InvalidArgumentError(
                absl::StrCat(out[i].error, " (--on-error skip skips such files)"));
          }
          KILN_LOG(WARNING) << "skipping " << out[i].error;
          skipped.push_back(li.skip_entry ? li.skip_entry(item, out[i].error)
                                          : nlohmann::json{{"file", key}, {"error", out[i].error}});
          continue;
        }
        KILN_RETURN_IF_ERROR(w.Write(out[i].payload));
        stats.Merge(out[i].stats);
        ++label_counts[li.label(item)];
      }
      done += n;
      report();
    }
    (*state)["stats"] = stats.ToPartialJson();
    (*state)["label_counts"] = label_counts;
    (*state)["crc32c"] = crcs;
    (*state)["skipped"] = skipped;
    return absl::OkStatus();
  };
  report();
  LabeledShards out;
  KILN_ASSIGN_OR_RETURN(std::vector<FinishedShard> finished,
                        WriteShards(env, li.out_dir, li.plan_fingerprint, split.shards, produce,
                                    &out.kept, [&](size_t i) {
                                      done += static_cast<int64_t>(split.items[i].size());
                                      report();
                                    }));
  // Every shard's state, in plan order.
  out.stats = ChannelStats(li.channels);
  try {
    for (const FinishedShard& f : finished) {
      out.stats.Merge(ChannelStats::FromPartialJson(f.state.at("stats")));
      std::vector<int64_t> c = f.state.at("label_counts").get<std::vector<int64_t>>();
      if (!out.label_counts.contains(f.entry.split))
        out.label_counts[f.entry.split] = std::vector<int64_t>(li.num_labels, 0);
      for (size_t i = 0; i < c.size() && i < li.num_labels; ++i) {
        out.label_counts[f.entry.split][i] =
            out.label_counts[f.entry.split][i].get<int64_t>() + c[i];
      }
      for (const auto& [key, crc] : f.state.at("crc32c").items())
        out.crc_of[key] = crc.get<uint32_t>();
      for (const auto& s : f.state.at("skipped")) out.skipped.push_back(s);
      out.shards.push_back(f.entry);
    }
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat("import state in ", li.out_dir, "/", kImportStateDir,
                                            " is malformed: ", e.what(), " (delete it and rerun)"));
  }
  return out;
}

void SummarizeManifest(const DatasetManifest& m, ImportSummary* s) {
  s->shards = static_cast<int>(m.shards.size());
  s->splits = m.SplitExamples();
  s->examples = 0;
  for (const auto& [split, n] : s->splits) s->examples += n;
  s->skipped = static_cast<int64_t>(m.skipped.size());
  s->units = s->examples;
}

}  // namespace kiln::data
