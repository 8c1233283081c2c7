#include "kiln/data/import/csv_import.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kiln/base/crc32c.h"
#include "kiln/base/status.h"
#include "kiln/data/csv.h"
#include "kiln/data/dataset.h"
#include "kiln/data/dataset_manifest.h"
#include "kiln/data/digits.h"
#include "kiln/data/example_proto.h"
#include "kiln/data/shard_io.h"
#include "yaml-cpp/yaml.h"

namespace kiln::data {
namespace {

enum class ColumnType { kNumeric, kCategorical, kIgnore };

struct Column {
  std::string name;
  ColumnType type = ColumnType::kIgnore;
  bool has_default = false;
  std::string default_value;
  bool fixed_vocabulary = false;
  std::vector<std::string> vocabulary;
  int csv_index = -1;  // position in each record
};

struct Schema {
  bool header = true;
  char delimiter = ',';
  std::string label;
  std::vector<Column> columns;
  bool by_position = false;  // a list without a header
};

absl::Status SchemaError(const std::string& path, const YAML::Node& node, const std::string& what) {
  const YAML::Mark m = node.Mark();
  return absl::InvalidArgumentError(
      m.line >= 0 ? absl::StrCat(path, ":", m.line + 1, ":", m.column + 1, ": ", what)
                  : absl::StrCat(path, ": ", what));
}

absl::Status ParseColumn(const std::string& path, const std::string& name, const YAML::Node& spec,
                         Column* c) {
  c->name = name;
  YAML::Node type = spec.IsMap() ? spec["type"] : spec;
  if (!type || !type.IsScalar()) {
    return SchemaError(path, spec,
                       "column '" + name + "' needs a type (numeric, categorical or ignore)");
  }
  const std::string t = type.as<std::string>();
  if (t == "numeric") {
    c->type = ColumnType::kNumeric;
  } else if (t == "categorical") {
    c->type = ColumnType::kCategorical;
  } else if (t == "ignore") {
    c->type = ColumnType::kIgnore;
  } else {
    return SchemaError(
        path, type,
        "column '" + name + "': unknown type '" + t + "' (numeric, categorical or ignore)");
  }
  if (!spec.IsMap()) return absl::OkStatus();
  for (const auto& kv : spec) {
    const std::string key = kv.first.as<std::string>();
    if (key == "type" || key == "name") continue;
    if (key == "default") {
      c->has_default = true;
      c->default_value = kv.second.as<std::string>();
    } else if (key == "vocabulary" && c->type == ColumnType::kCategorical &&
               kv.second.IsSequence()) {
      c->fixed_vocabulary = true;
      for (const auto& v : kv.second) c->vocabulary.push_back(v.as<std::string>());
    } else {
      return SchemaError(path, kv.first, "column '" + name + "': unknown key '" + key + "'");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Schema> ParseSchema(const std::string& path, const std::string& text) {
  Schema s;
  try {
    YAML::Node root = YAML::Load(text);
    if (!root.IsMap()) return absl::InvalidArgumentError(path + ": the schema must be a YAML map");
    for (const auto& kv : root) {
      const std::string key = kv.first.as<std::string>();
      if (key == "header") {
        s.header = kv.second.as<bool>();
      } else if (key == "delimiter") {
        const std::string d = kv.second.as<std::string>();
        if (d.size() != 1 || d == "\"" || d == "\n")
          return SchemaError(path, kv.second, "delimiter must be one character");
        s.delimiter = d[0];
      } else if (key == "label") {
        s.label = kv.second.as<std::string>();
      } else if (key == "columns") {
        if (kv.second.IsMap()) {
          for (const auto& col : kv.second) {
            Column c;
            KILN_RETURN_IF_ERROR(ParseColumn(path, col.first.as<std::string>(), col.second, &c));
            s.columns.push_back(std::move(c));
          }
        } else if (kv.second.IsSequence()) {
          for (const auto& col : kv.second) {
            if (!col.IsMap() || !col["name"])
              return SchemaError(path, col, "each column needs a name");
            Column c;
            KILN_RETURN_IF_ERROR(ParseColumn(path, col["name"].as<std::string>(), col, &c));
            s.columns.push_back(std::move(c));
          }
          s.by_position = true;
        } else {
          return SchemaError(path, kv.second, "columns must be a map or a list");
        }
      } else {
        return SchemaError(path, kv.first,
                           "unknown key '" + key + "' (header, delimiter, label, columns)");
      }
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg));
  }
  if (s.columns.empty()) return absl::InvalidArgumentError(path + ": no columns");
  if (!s.header && !s.by_position) {
    return absl::InvalidArgumentError(path +
                                      ": without a header, columns must be a list (in CSV order)");
  }
  std::set<std::string> names;
  for (Column& c : s.columns) {
    if (c.name.empty() || !names.insert(c.name).second) {
      return absl::InvalidArgumentError(path + ": column '" + c.name +
                                        "' is empty or listed twice");
    }
  }
  if (!s.label.empty() && !names.count(s.label)) {
    return absl::InvalidArgumentError(path + ": label '" + s.label + "' is not a column");
  }
  return s;
}

absl::StatusOr<double> ParseNumber(const std::string& s) {
  double v = 0;
  if (!ParseCsvDouble(TrimCsvField(s), &v) || !std::isfinite(v)) {
    return absl::InvalidArgumentError("'" + s + "' is not a finite number");
  }
  return v;
}

}  // namespace

namespace {

absl::Status CheckCsvOptions(const CsvImportOptions& o) {
  if (o.file.empty()) return absl::InvalidArgumentError("no CSV file given");
  if (o.schema.empty()) return absl::InvalidArgumentError("--schema is required");
  if (o.out_dir.empty()) return absl::InvalidArgumentError("--out is required");
  if (o.shards < 1 || o.shards > 99999)
    return absl::InvalidArgumentError("--shards must be 1..99999");
  if (!(o.held_out >= 0 && o.held_out < 1))
    return absl::InvalidArgumentError("--held-out must be in [0, 1)");
  return absl::OkStatus();
}

// Binds schema columns to record positions; every header column must be in the schema.
absl::Status BindColumns(Schema* s, std::vector<CsvRecord>* records, const std::string& path) {
  if (!s->header) {
    for (size_t k = 0; k < s->columns.size(); ++k) s->columns[k].csv_index = static_cast<int>(k);
    return absl::OkStatus();
  }
  if (records->empty()) return absl::InvalidArgumentError(path + ": empty file (no header)");
  const CsvRecord header = std::move(records->front());
  records->erase(records->begin());
  std::map<std::string, int> pos;
  for (size_t k = 0; k < header.fields.size(); ++k) {
    if (!pos.emplace(header.fields[k], static_cast<int>(k)).second) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", header.line, ":", k + 1,
                                                     ": column '", header.fields[k],
                                                     "' appears twice in the header"));
    }
  }
  std::set<std::string> listed;
  for (Column& c : s->columns) {
    auto it = pos.find(c.name);
    if (it == pos.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", header.line, ": the header has no column '", c.name, "' (from the schema)"));
    }
    c.csv_index = it->second;
    listed.insert(c.name);
  }
  for (size_t k = 0; k < header.fields.size(); ++k) {
    if (!listed.count(header.fields[k])) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", header.line, ":", k + 1, ": column '", header.fields[k],
                       "' is not in the schema (list it, with type ignore to drop it)"));
    }
  }
  return absl::OkStatus();
}

// Pass 1 over the records (in file order): checks every cell, collects each numeric column's
// statistics and each categorical column's vocabulary.
absl::Status CheckCells(const std::string& file, const std::vector<CsvRecord>& records,
                        Schema* schema, std::vector<ChannelStats>* stats) {
  int expected = 0;
  for (const Column& c : schema->columns) expected = std::max(expected, c.csv_index + 1);

  std::vector<std::set<std::string>> seen(schema->columns.size());
  stats->assign(schema->columns.size(), ChannelStats(1));
  for (const CsvRecord& r : records) {
    if (r.fields.size() != static_cast<size_t>(expected)) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ":", r.line, ": ", r.fields.size(), " fields, expected ", expected));
    }
    for (size_t k = 0; k < schema->columns.size(); ++k) {
      const Column& c = schema->columns[k];
      if (c.type == ColumnType::kIgnore) continue;
      std::string v = r.fields[c.csv_index];
      const std::string where =
          absl::StrCat(file, ":", r.line, ":", c.csv_index + 1, " (column '", c.name, "'): ");
      if (v.empty()) {
        if (!c.has_default)
          return absl::InvalidArgumentError(where + "empty cell (give the column a default)");
        v = c.default_value;
      }
      if (c.type == ColumnType::kNumeric) {
        absl::StatusOr<double> d = ParseNumber(v);
        if (!d.ok()) return absl::InvalidArgumentError(where + std::string(d.status().message()));
        (*stats)[k].Add(static_cast<double>(static_cast<float>(*d)), 0);
      } else if (c.fixed_vocabulary) {
        if (std::find(c.vocabulary.begin(), c.vocabulary.end(), v) == c.vocabulary.end()) {
          return absl::InvalidArgumentError(where + "'" + v +
                                            "' is not in the column's vocabulary");
        }
      } else {
        seen[k].insert(v);
      }
    }
  }
  for (size_t k = 0; k < schema->columns.size(); ++k) {
    Column& c = schema->columns[k];
    if (c.type != ColumnType::kCategorical || c.fixed_vocabulary) continue;
    c.vocabulary.assign(seen[k].begin(), seen[k].end());
    // Values that are all integers (class numbers) sort numerically: "2" before "10".
    bool integers = true;
    for (const std::string& v : c.vocabulary) {
      int64_t x;
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
      integers = integers && ec == std::errc() && p == v.data() + v.size();
    }
    if (integers) {
      std::stable_sort(c.vocabulary.begin(), c.vocabulary.end(),
                       [](const std::string& a, const std::string& b) {
                         int64_t x = 0, y = 0;
                         std::from_chars(a.data(), a.data() + a.size(), x);
                         std::from_chars(b.data(), b.data() + b.size(), y);
                         return x < y;
                       });
    }
  }
  return absl::OkStatus();
}

DatasetManifest CsvManifest(const Schema& schema, const std::vector<ChannelStats>& stats,
                            const std::vector<FinishedShard>& finished) {
  DatasetManifest m;
  m.kind = "csv";
  for (size_t k = 0; k < schema.columns.size(); ++k) {
    const Column& c = schema.columns[k];
    if (c.type == ColumnType::kIgnore) continue;
    if (c.type == ColumnType::kNumeric) {
      m.features.push_back({c.name, "float32", {}, "numeric column"});
      m.statistics[c.name] = stats[k].Summary();
    } else {
      m.features.push_back(
          {c.name, "int64", {}, "categorical column: index into vocabularies." + c.name});
      m.vocabularies[c.name] = c.vocabulary;
      m.statistics[c.name] = {{"distinct", c.vocabulary.size()}};
    }
    if (c.name == schema.label) {
      m.label_feature = c.name;
      m.label_vocabulary = c.vocabulary;  // empty for a numeric label
    }
  }
  for (const FinishedShard& f : finished) m.shards.push_back(f.entry);
  return m;
}

}  // namespace

absl::StatusOr<ImportSummary> ImportCsv(Env* env, const CsvImportOptions& o,
                                        const ProgressFn& progress) {
  KILN_RETURN_IF_ERROR(CheckCsvOptions(o));
  KILN_ASSIGN_OR_RETURN(std::string schema_text, ReadFileToString(env, o.schema));
  KILN_ASSIGN_OR_RETURN(Schema schema, ParseSchema(o.schema, schema_text));
  KILN_ASSIGN_OR_RETURN(uint64_t file_size, env->GetFileSize(o.file));
  KILN_ASSIGN_OR_RETURN(std::string text, ReadMaybeGzippedFile(o.file, env));
  const uint32_t file_crc = crc32c::Value(text.data(), text.size());
  KILN_ASSIGN_OR_RETURN(std::vector<CsvRecord> records,
                        ParseCsv(text, o.file, CsvOptions{schema.delimiter}));
  text.clear();
  text.shrink_to_fit();
  KILN_RETURN_IF_ERROR(BindColumns(&schema, &records, o.file));
  if (records.empty()) return absl::InvalidArgumentError(o.file + ": no data rows");
  std::vector<ChannelStats> stats;
  KILN_RETURN_IF_ERROR(CheckCells(o.file, records, &schema, &stats));
  std::vector<std::map<std::string, int64_t>> ids(schema.columns.size());
  for (size_t k = 0; k < schema.columns.size(); ++k) {
    for (size_t i = 0; i < schema.columns[k].vocabulary.size(); ++i)
      ids[k][schema.columns[k].vocabulary[i]] = static_cast<int64_t>(i);
  }

  const int64_t n = static_cast<int64_t>(records.size());
  const ShardPlan split = PlanSplits(n, o.held_out, o.shards, o.seed);
  const std::vector<PlannedShard>& plan = split.shards;
  const std::vector<std::vector<int64_t>>& shard_items = split.items;
  const std::string source_fp =
      Hex64(Fnv1a64(absl::StrCat("csv\t", file_size, "\t", Hex32(file_crc), "\n")));
  const std::string plan_fp = Hex64(Fnv1a64(
      absl::StrCat(source_fp, "|", schema_text, "|", o.shards, "|", o.held_out, "|", o.seed)));
  const int threads = ResolveThreads(o.threads);

  auto encode = [&](int64_t row) {
    const CsvRecord& r = records[row];
    Example ex;
    for (size_t k = 0; k < schema.columns.size(); ++k) {
      const Column& c = schema.columns[k];
      if (c.type == ColumnType::kIgnore) continue;
      const std::string& raw = r.fields[c.csv_index];
      const std::string& v = raw.empty() ? c.default_value : raw;
      if (c.type == ColumnType::kNumeric) {
        ex.features[c.name] = Feature::Floats({static_cast<float>(*ParseNumber(v))});
      } else {
        ex.features[c.name] = Feature::Int64s({ids[k].at(v)});
      }
    }
    return EncodeExample(ex);
  };
  int64_t done = 0;
  auto produce = [&](size_t index, ShardWriter& w, nlohmann::json* state) -> absl::Status {
    const std::vector<int64_t>& items = shard_items[index];
    const int64_t block = 4096;
    for (int64_t b = 0; b < static_cast<int64_t>(items.size()); b += block) {
      const int64_t m = std::min<int64_t>(block, items.size() - b);
      std::vector<std::string> out(m);
      ParallelFor(threads, m, [&](int64_t i) { out[i] = encode(items[b + i]); });
      for (const std::string& p : out) KILN_RETURN_IF_ERROR(w.Write(p));
      done += m;
      if (progress) progress({"encode", done, n, "rows"});
    }
    *state = nlohmann::json::object();
    return absl::OkStatus();
  };
  ImportSummary summary;
  KILN_ASSIGN_OR_RETURN(
      std::vector<FinishedShard> finished,
      WriteShards(env, o.out_dir, plan_fp, plan, produce, &summary.shards_kept, [&](size_t i) {
        done += static_cast<int64_t>(shard_items[i].size());
        if (progress) progress({"encode", done, n, "rows"});
      }));

  DatasetManifest m = CsvManifest(schema, stats, finished);
  m.source_fingerprint = source_fp;
  m.source_files = 1;
  m.source_bytes = file_size;
  m.import_options = {{"file", o.file},     {"schema", o.schema},     {"schema_text", schema_text},
                      {"shards", o.shards}, {"held_out", o.held_out}, {"seed", o.seed}};
  KILN_RETURN_IF_ERROR(WriteManifest(env, o.out_dir, m));
  summary.shards = static_cast<int>(m.shards.size());
  summary.splits = m.SplitExamples();
  for (const auto& [split, k] : summary.splits) summary.examples += k;
  summary.units = summary.examples;
  summary.input_bytes = file_size;
  return summary;
}

}  // namespace kiln::data
