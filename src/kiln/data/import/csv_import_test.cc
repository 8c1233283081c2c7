#include "kiln/data/import/csv_import.h"

#include <map>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "kiln/base/env.h"
#include "kiln/data/dataset_manifest.h"
#include "kiln/data/shard_io.h"
#include "tests/support/temp_dir.h"

namespace kiln::data {
namespace {

struct Fixture {
  Env* env = Env::Default();
  std::string dir = test_support::MakeTempDir("csv_import_test");
  std::string Write(const std::string& name, const std::string& text) {
    const std::string p = JoinPath(dir, name);
    EXPECT_TRUE(WriteStringToFile(env, text, p).ok());
    return p;
  }
};

std::vector<Example> ReadAll(Env* env, const std::string& dir, const DatasetManifest& m) {
  std::vector<Example> out;
  for (const ShardEntry& e : m.shards) {
    auto r = ExampleReader::Open(env, JoinPath(dir, e.file));
    EXPECT_TRUE(r.ok());
    Example ex;
    while (*(*r)->Next(&ex)) out.push_back(ex);
  }
  return out;
}

const char kSchema[] =
    "label: species\n"
    "columns:\n"
    "  length: numeric\n"
    "  color: {type: categorical}\n"
    "  note: ignore\n"
    "  species: categorical\n"
    "  width: {type: numeric, default: 0.5}\n";

std::string Rows(int n) {
  std::string csv = "length,color,note,species,width\n";
  const char* colors[] = {"red", "blue", "\"dark, green\""};
  const char* species[] = {"setosa", "virginica"};
  for (int i = 0; i < n; ++i) {
    csv += std::to_string(i) + "," + colors[i % 3] + ",\"say \"\"hi\"\"\nover lines\"," +
           species[i % 2] + "," + (i % 4 == 0 ? "" : std::to_string(i) + ".25") + "\r\n";
  }
  return csv;
}

TEST(CsvImport, FeaturesVocabulariesStatisticsAndDeterminism) {
  Fixture f;
  const std::string csv = f.Write("iris.csv", Rows(40));
  const std::string schema = f.Write("schema.yaml", kSchema);
  std::vector<std::map<std::string, std::string>> files;
  for (int threads : {1, 3}) {
    CsvImportOptions o;
    o.file = csv;
    o.schema = schema;
    o.out_dir = JoinPath(f.dir, "out" + std::to_string(threads));
    o.shards = 3;
    o.held_out = 0.25;
    o.threads = threads;
    absl::StatusOr<ImportSummary> s = ImportCsv(f.env, o);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->examples, 40);
    EXPECT_EQ(s->splits["held_out"], 10);
    std::map<std::string, std::string> got;
    const std::vector<std::string> names = *f.env->GetChildren(o.out_dir);
    for (const std::string& name : names) {
      if (name[0] != '.') got[name] = *ReadFileToString(f.env, JoinPath(o.out_dir, name));
    }
    files.push_back(got);
  }
  EXPECT_EQ(files[0], files[1]);
  const std::string out = JoinPath(f.dir, "out1");
  absl::StatusOr<DatasetManifest> m = ReadManifest(f.env, out);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->label_feature, "species");
  EXPECT_EQ(m->label_vocabulary, (std::vector<std::string>{"setosa", "virginica"}));
  EXPECT_EQ(m->vocabularies["color"], (std::vector<std::string>{"blue", "dark, green", "red"}));
  EXPECT_EQ(m->FindFeature("note"), nullptr);
  EXPECT_EQ(m->FindFeature("length")->dtype, "float32");
  EXPECT_EQ(m->statistics["length"]["mean"][0], 19.5);
  EXPECT_EQ(m->statistics["length"]["min"][0], 0.0);
  EXPECT_EQ(m->statistics["length"]["max"][0], 39.0);
  std::vector<Example> all = ReadAll(f.env, out, *m);
  ASSERT_EQ(all.size(), 40u);
  int checked = 0;
  for (const Example& ex : all) {
    const int i = static_cast<int>(ex.features.at("length").float_list.at(0));
    EXPECT_EQ(ex.features.at("species").int64_list.at(0), i % 2);
    const int64_t color = ex.features.at("color").int64_list.at(0);
    EXPECT_EQ(color, (std::vector<int64_t>{2, 0, 1})[i % 3]);
    EXPECT_EQ(ex.features.at("width").float_list.at(0), i % 4 == 0 ? 0.5f : i + 0.25f);
    ++checked;
  }
  EXPECT_EQ(checked, 40);

  // A rerun keeps every shard (verified), and gives the same files.
  CsvImportOptions o;
  o.file = csv;
  o.schema = schema;
  o.out_dir = out;
  o.shards = 3;
  o.held_out = 0.25;
  absl::StatusOr<ImportSummary> again = ImportCsv(f.env, o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->shards_kept, again->shards);
}

TEST(CsvImport, NoHeaderListSchema) {
  Fixture f;
  const std::string csv = f.Write("d.csv", "1;10\n2;2\n\n3;10\n");
  const std::string schema =
      f.Write("s.yaml",
              "header: false\ndelimiter: \";\"\nlabel: y\n"
              "columns:\n  - {name: x, type: numeric}\n  - {name: y, type: categorical}\n");
  CsvImportOptions o{csv, schema, JoinPath(f.dir, "out"), 1, 0.0, 0, 1};
  absl::StatusOr<ImportSummary> s = ImportCsv(f.env, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->examples, 3);
  EXPECT_EQ(s->splits.count("held_out"), 0u);
  absl::StatusOr<DatasetManifest> m = ReadManifest(f.env, o.out_dir);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->label_vocabulary, (std::vector<std::string>{"2", "10"}));  // integers: numeric order
}

TEST(CsvImport, ErrorsNameFileLineAndColumn) {
  Fixture f;
  const std::string schema =
      f.Write("s.yaml", "label: y\ncolumns:\n  x: numeric\n  y: categorical\n");
  struct Case {
    std::string csv;
    std::string message;
  };
  const Case cases[] = {
      {"x,y\n1,a\n2x,b\n", "bad.csv:3:1 (column 'x'): '2x' is not a finite number"},
      {"x,y\n1,a\n2,b,c\n", "bad.csv:3: 3 fields, expected 2"},
      {"x,y\n1,\"a\n", "bad.csv:2:3: unterminated quoted field"},
      {"x,y\n1,a\"b\n", "bad.csv:2:4: quote inside an unquoted field"},
      {"x,y\n,a\n", "bad.csv:2:1 (column 'x'): empty cell"},
      {"x,z\n1,a\n", "bad.csv:1: the header has no column 'y'"},
      {"x,y,w\n1,a,2\n", "bad.csv:1:3: column 'w' is not in the schema"},
      {"x,y\n", "bad.csv: no data rows"},
      {"x,y\n1,inf\n1,nan\n2,1e999\n", ""},  // categorical: any text is fine
  };
  for (const Case& c : cases) {
    const std::string csv = f.Write("bad.csv", c.csv);
    CsvImportOptions o{csv, schema, JoinPath(f.dir, "out"), 1, 0.0, 0, 1};
    absl::StatusOr<ImportSummary> s = ImportCsv(f.env, o);
    if (c.message.empty()) {
      EXPECT_TRUE(s.ok()) << s.status();
      continue;
    }
    ASSERT_FALSE(s.ok()) << c.csv;
    EXPECT_NE(s.status().message().find(c.message), std::string::npos) << s.status();
  }
  const std::string bad_num = f.Write("n.csv", "x,y\n1e999,a\n");
  CsvImportOptions o{bad_num, schema, JoinPath(f.dir, "out"), 1, 0.0, 0, 1};
  EXPECT_NE(ImportCsv(f.env, o).status().message().find("n.csv:2:1 (column 'x')"),
            std::string::npos);

  // Schema errors name the schema file and line.
  const std::string s2 = f.Write("s2.yaml", "columns:\n  x: numeric\n  y: text\n");
  CsvImportOptions o2{bad_num, s2, JoinPath(f.dir, "out"), 1, 0.0, 0, 1};
  absl::Status st = ImportCsv(f.env, o2).status();
  EXPECT_NE(st.message().find("s2.yaml:3:"), std::string::npos) << st;
  EXPECT_NE(st.message().find("unknown type 'text'"), std::string::npos) << st;
  const std::string s3 = f.Write("s3.yaml", "label: q\ncolumns: {x: numeric}\n");
  CsvImportOptions o3{bad_num, s3, JoinPath(f.dir, "out"), 1, 0.0, 0, 1};
  EXPECT_NE(ImportCsv(f.env, o3).status().message().find("label 'q' is not a column"),
            std::string::npos);
  const std::string s4 = f.Write("s4.yaml", "columns: [x: 1\n");
  CsvImportOptions o4{bad_num, s4, JoinPath(f.dir, "out"), 1, 0.0, 0, 1};
  EXPECT_NE(ImportCsv(f.env, o4).status().message().find("s4.yaml:"), std::string::npos);
}

TEST(CsvImport, RandomBytesNeverCrash) {
  Fixture f;
  const std::string schema =
      f.Write("s.yaml", "label: y\ncolumns:\n  x: numeric\n  y: categorical\n");
  std::mt19937_64 rng(5);
  const std::string alphabet = "xy,\"\n\r12.e-a ";
  for (int iter = 0; iter < 200; ++iter) {
    std::string csv = "x,y\n";
    for (int n = static_cast<int>(rng() % 40); n > 0; --n)
      csv.push_back(alphabet[rng() % alphabet.size()]);
    CsvImportOptions o{f.Write("r.csv", csv), schema, JoinPath(f.dir, "out"), 1, 0.0, 0, 2};
    absl::StatusOr<ImportSummary> s = ImportCsv(f.env, o);
    if (!s.ok()) {
      EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
      EXPECT_NE(s.status().message().find("r.csv"), std::string::npos) << s.status();
    }
  }
}

}  // namespace
}  // namespace kiln::data
