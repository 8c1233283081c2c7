#include "kiln/train/config.h"

#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/mem_env.h"

namespace kiln::train {
namespace {

using ::testing::HasSubstr;

constexpr char kBase[] = R"(
model: {kind: mlp, hidden: [32]}
data: {source: d.csv, batch_size: 16}
optimizer: {kind: adamw, lr: 0.001}
steps: 50
)";

TEST(ConfigTest, ParsesAndFillsDefaults) {
  absl::StatusOr<TrainConfig> c = ParseTrainConfig(kBase, "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.hidden, std::vector<int64_t>{32});
  EXPECT_EQ(c->data.batch_size, 16);
  EXPECT_EQ(c->optimizer.kind, "adamw");
  EXPECT_EQ(c->steps, 50);
  EXPECT_EQ(c->keep_last, 3);
  EXPECT_EQ(c->precision, "f32");
}

TEST(ConfigTest, PrecisionPolicies) {
  for (const char* p : {"f32", "mixed_bf16", "bf16"}) {
    absl::StatusOr<TrainConfig> c =
        ParseTrainConfig(kBase, "t.yaml", {std::string("precision=") + p});
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->precision, p);
    // It is part of the resolved config, so it changes the hash.
    absl::StatusOr<TrainConfig> back = ParseTrainConfig(ConfigToYaml(*c), "resolved.yaml");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->precision, p);
  }
  absl::StatusOr<TrainConfig> f32 = ParseTrainConfig(kBase, "t.yaml");
  absl::StatusOr<TrainConfig> mixed = ParseTrainConfig(kBase, "t.yaml", {"precision=mixed_bf16"});
  ASSERT_TRUE(f32.ok() && mixed.ok());
  EXPECT_NE(ConfigHash(*f32), ConfigHash(*mixed));
  // ValidateTrainConfig checks configs built in code too.
  TrainConfig c = *f32;
  c.precision = "f16";
  absl::Status s = ValidateTrainConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("precision: 'f16' is not one of f32, mixed_bf16, bf16"));
}

TEST(ConfigTest, OverridesApplyAndCreateSections) {
  absl::StatusOr<TrainConfig> c = ParseTrainConfig(
      kBase, "t.yaml",
      {"steps=7", "model.hidden=[8,4]", "schedule.kind=cosine", "schedule.warmup_steps=2"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->steps, 7);
  EXPECT_EQ(c->model.hidden, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(c->schedule.kind, "cosine");
}

TEST(ConfigTest, UnknownKeyNamesDottedPathAndAllowed) {
  absl::StatusOr<TrainConfig> c = ParseTrainConfig(kBase, "t.yaml", {"model.widht=3"});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("model.widht: unknown key"));
  EXPECT_THAT(c.status().message(), HasSubstr("hidden"));
  c = ParseTrainConfig(std::string(kBase) + "stepz: 3\n", "t.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("stepz: unknown key"));
}

TEST(ConfigTest, BadValuesNameKeyAndAllowedValues) {
  auto err = [](const std::string& o) {
    absl::StatusOr<TrainConfig> c = ParseTrainConfig(kBase, "t.yaml", {o});
    return c.ok() ? std::string("OK") : std::string(c.status().message());
  };
  EXPECT_THAT(err("optimizer.kind=adam"),
              HasSubstr("optimizer.kind: 'adam' is not one of sgd, adamw"));
  EXPECT_THAT(err("precision=fp16"),
              HasSubstr("precision: 'fp16' is not one of f32, mixed_bf16, bf16"));
  EXPECT_THAT(err("steps=abc"), HasSubstr("steps: expected an integer"));
  EXPECT_THAT(err("steps=0"), HasSubstr("steps: must be >= 1"));
  EXPECT_THAT(err("data.held_out_fraction=1.5"), HasSubstr("data.held_out_fraction"));
  EXPECT_THAT(err("optimizer.betas=[0.9]"), HasSubstr("optimizer.betas"));
  EXPECT_THAT(err("data.remainder=zero"),
              HasSubstr("data.remainder: 'zero' is not one of drop, wrap, pad"));
  EXPECT_THAT(err("nonsense"), HasSubstr("expected key=value"));
  EXPECT_THAT(err("model.kind=gpt"),
              HasSubstr("data.source: model.kind gpt needs a \"text:PATH\""));
  EXPECT_THAT(err("data.source=text:/x.txt"), HasSubstr("needs model.kind gpt"));
}

TEST(ConfigTest, MalformedYamlIsAnError) {
  absl::StatusOr<TrainConfig> c = ParseTrainConfig("model: [unclosed", "bad.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("bad.yaml"));
}

TEST(ConfigTest, YamlRoundTripsAndHashIsStable) {
  absl::StatusOr<TrainConfig> c = ParseTrainConfig(kBase, "t.yaml");
  ASSERT_TRUE(c.ok());
  std::string yaml = ConfigToYaml(*c);
  absl::StatusOr<TrainConfig> back = ParseTrainConfig(yaml, "resolved.yaml");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << yaml;
  EXPECT_EQ(ConfigToYaml(*back), yaml);
  EXPECT_EQ(ConfigHash(*back), ConfigHash(*c));
  EXPECT_EQ(ConfigHash(*c).size(), 16u);
  TrainConfig moved = *c;
  moved.output_dir = "elsewhere";
  EXPECT_EQ(ConfigHash(moved), ConfigHash(*c));
  moved.optimizer.lr = 0.002;
  EXPECT_NE(ConfigHash(moved), ConfigHash(*c));
}

constexpr char kGpt[] = R"(
model: {kind: gpt, n_layer: 3, n_head: 2, n_embd: 32, dropout: 0.1}
data: {source: "text:/usr/share/common-licenses/GPL-3", seq_len: 16, batch_size: 4}
optimizer: {kind: adamw, lr: 0.003}
steps: 20
)";

TEST(ConfigTest, GptKeysParseValidateAndRoundTrip) {
  absl::StatusOr<TrainConfig> c = ParseTrainConfig(kGpt, "g.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.n_layer, 3);
  EXPECT_EQ(c->model.n_head, 2);
  EXPECT_EQ(c->model.n_embd, 32);
  EXPECT_EQ(c->model.n_ctx, 0);
  EXPECT_EQ(c->model.vocab_size, 256);
  EXPECT_EQ(c->data.seq_len, 16);
  std::string yaml = ConfigToYaml(*c);
  EXPECT_THAT(yaml, HasSubstr("n_embd: 32"));
  EXPECT_THAT(yaml, HasSubstr("seq_len: 16"));
  absl::StatusOr<TrainConfig> back = ParseTrainConfig(yaml, "resolved.yaml");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << yaml;
  EXPECT_EQ(ConfigToYaml(*back), yaml);

  auto err = [](const std::string& o) {
    absl::StatusOr<TrainConfig> c = ParseTrainConfig(kGpt, "g.yaml", {o});
    return c.ok() ? std::string("OK") : std::string(c.status().message());
  };
  EXPECT_THAT(err("model.n_embd=33"), HasSubstr("model.n_embd: must be a multiple of"));
  EXPECT_THAT(err("model.n_layer=0"), HasSubstr("model.n_layer: must be >= 1"));
  EXPECT_THAT(err("model.vocab_size=100"), HasSubstr("model.vocab_size: must be >= 256"));
  EXPECT_THAT(err("model.n_ctx=8"), HasSubstr("model.n_ctx"));
  EXPECT_EQ(err("model.n_ctx=64"), "OK");
  EXPECT_THAT(err("data.seq_len=0"), HasSubstr("data.seq_len: must be >= 1"));
  EXPECT_THAT(err("model.dropout=1"), HasSubstr("model.dropout"));
  EXPECT_THAT(err("model.n_hed=2"), HasSubstr("model.n_hed: unknown key"));
}

// config.yaml lists every key with its value, the other model kinds' keys too, but the hash is
// the one these configs had before those keys (and nonfinite_patience) were written, so old runs
// resume without a "config hash changed" note. The pinned values are what the code before the
// change computed.
TEST(ConfigTest, ResolvedYamlListsEveryKeyAndTheHashIsUnchanged) {
  absl::StatusOr<TrainConfig> c = ParseTrainConfig(kBase, "t.yaml");
  ASSERT_TRUE(c.ok());
  for (const char* key : {"n_embd: 64", "n_layer: 2", "vocab_size: 256", "seq_len: 0",
                          "nonfinite_patience: 3", "patch: 2", "widths: [16, 32]"}) {
    EXPECT_THAT(ConfigToYaml(*c), HasSubstr(key));
  }
  EXPECT_EQ(ConfigHash(*c), "115a97d53e7378b9");
  absl::StatusOr<TrainConfig> g = ParseTrainConfig(kGpt, "g.yaml");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(ConfigHash(*g), "fce201b15071004e");
  TrainConfig patient = *c;
  patient.nonfinite_patience = 10;
  EXPECT_NE(ConfigHash(patient), ConfigHash(*c));
  absl::StatusOr<TrainConfig> back = ParseTrainConfig(ConfigToYaml(patient), "resolved.yaml");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->nonfinite_patience, 10);
}

// memory_limit_mib changes how much memory the step takes, not what it computes: it round-trips
// through the resolved YAML but leaves the hash alone; a negative limit is refused by name.
TEST(ConfigTest, MemoryLimitIsNotHashed) {
  absl::StatusOr<TrainConfig> c = ParseTrainConfig(kBase, "t.yaml");
  ASSERT_TRUE(c.ok());
  absl::StatusOr<TrainConfig> limited = ParseTrainConfig(kBase, "t.yaml", {"memory_limit_mib=512"});
  ASSERT_TRUE(limited.ok()) << limited.status();
  EXPECT_EQ(limited->memory_limit_mib, 512);
  EXPECT_EQ(ConfigHash(*limited), ConfigHash(*c));
  absl::StatusOr<TrainConfig> back = ParseTrainConfig(ConfigToYaml(*limited), "resolved.yaml");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->memory_limit_mib, 512);
  absl::StatusOr<TrainConfig> bad = ParseTrainConfig(kBase, "t.yaml", {"memory_limit_mib=-1"});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("memory_limit_mib"));
}

// mesh: {data, model} round-trips, is not hashed (the same config trains the same examples on
// any mesh) and is range-checked by name.
TEST(ConfigTest, MeshParsesRoundTripsAndIsNotHashed) {
  absl::StatusOr<TrainConfig> c = ParseTrainConfig(kBase, "t.yaml");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->mesh.data, 0);
  EXPECT_EQ(c->mesh.model, 1);
  absl::StatusOr<TrainConfig> m =
      ParseTrainConfig(kBase, "t.yaml", {"mesh.data=2", "mesh.model=2"});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->mesh.data, 2);
  EXPECT_EQ(m->mesh.model, 2);
  EXPECT_EQ(ConfigHash(*m), ConfigHash(*c));
  absl::StatusOr<TrainConfig> back = ParseTrainConfig(ConfigToYaml(*m), "resolved.yaml");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->mesh.data, 2);
  EXPECT_EQ(back->mesh.model, 2);
  for (const char* bad : {"mesh.model=0", "mesh.data=-1", "mesh.pipeline=2"}) {
    absl::StatusOr<TrainConfig> b = ParseTrainConfig(kBase, "t.yaml", {bad});
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_THAT(std::string(b.status().message()), HasSubstr("mesh.")) << bad;
  }
}

// Issue 13 case 6: yaml-cpp keeps the first of two equal keys and drops the second silently.
TEST(ConfigTest, ADuplicateKeyIsRejectedNamingBothLines) {
  absl::StatusOr<TrainConfig> c = ParseTrainConfig(
      "model: {kind: mlp}\ndata: {source: d.csv}\nsteps: 50\nlog_every: 5\n"
      "steps: 60\n",
      "run.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "run.yaml:5: steps: given twice (line 3 and line 5); YAML keeps only one of them, so "
            "delete the line you do not mean");
  absl::StatusOr<TrainConfig> nested = ParseTrainConfig(
      "data:\n  source: d.csv\n  batch_size: 16\n  shuffle: true\n  batch_size: 32\n", "n.yaml");
  ASSERT_FALSE(nested.ok());
  EXPECT_THAT(nested.status().message(),
              HasSubstr("n.yaml:5: data.batch_size: given twice (line 3 and line 5)"));
  // The same name in different sections is fine.
  EXPECT_TRUE(
      ParseTrainConfig("model: {kind: mlp}\ndata: {source: d.csv, seed: 1}\nseed: 2\n", "ok.yaml")
          .ok());
}

TEST(ConfigTest, ErrorsBlameTheOverrideThatCausedThem) {
  auto err = [](const std::vector<std::string>& o) {
    absl::StatusOr<TrainConfig> c = ParseTrainConfig(kBase, "t.yaml", o);
    return c.ok() ? std::string("OK") : std::string(c.status().message());
  };
  EXPECT_EQ(err({"optimizer=5"}),
            "--set optimizer=5: optimizer: expected a mapping of keys (like optimizer: {kind: "
            "...}), got '5'");
  EXPECT_THAT(err({"seed=-1"}),
              HasSubstr("--set seed=-1: seed: expected a non-negative integer (0 to "
                        "18446744073709551615), got '-1'"));
  EXPECT_THAT(err({"optimizer.lr=-1"}), HasSubstr("--set optimizer.lr=-1: optimizer.lr: must be"));
  EXPECT_THAT(err({"model.widht=3"}), HasSubstr("--set model.widht=3: model.widht: unknown key"));
  // Errors in the text itself name the source.
  absl::StatusOr<TrainConfig> bad = ParseTrainConfig("steps: 0\ndata: {source: d.csv}\n", "f.yaml");
  EXPECT_THAT(bad.status().message(), HasSubstr("f.yaml: steps: must be >= 1"));
  absl::StatusOr<TrainConfig> list = ParseTrainConfig("- 1\n- 2\n", "l.yaml");
  EXPECT_THAT(list.status().message(), HasSubstr("l.yaml: (top level): expected a mapping"));
}

TEST(ConfigTest, ShorteningARunBelowItsWarmupClampsTheWarmupWithANote) {
  const std::string cosine = std::string(kBase) + "schedule: {kind: cosine, warmup_steps: 20}\n";
  std::vector<std::string> notes;
  absl::StatusOr<TrainConfig> c = ParseTrainConfig(cosine, "t.yaml", {"steps=15"}, &notes);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->schedule.warmup_steps, 1);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_THAT(notes[0], HasSubstr("schedule.warmup_steps 20 of t.yaml is not below steps 15"));
  // Asked for explicitly, or written so in the file: an error naming the key to set.
  absl::StatusOr<TrainConfig> asked =
      ParseTrainConfig(cosine, "t.yaml", {"steps=15", "schedule.warmup_steps=30"});
  EXPECT_THAT(asked.status().message(),
              HasSubstr("--set schedule.warmup_steps=30: schedule.warmup_steps: must be < steps "
                        "(15) for a cosine schedule, got 30; set it lower (e.g. --set "
                        "schedule.warmup_steps=1)"));
  absl::StatusOr<TrainConfig> file = ParseTrainConfig(
      std::string(kBase) + "schedule: {kind: cosine, warmup_steps: 60}\n", "t2.yaml");
  EXPECT_THAT(file.status().message(),
              HasSubstr("t2.yaml: schedule.warmup_steps: must be < steps (50)"));
}

TEST(ConfigTest, NonfinitePatienceIsAPositiveKey) {
  absl::StatusOr<TrainConfig> c = ParseTrainConfig(kBase, "t.yaml", {"nonfinite_patience=1"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->nonfinite_patience, 1);
  EXPECT_EQ(ParseTrainConfig(kBase, "t.yaml")->nonfinite_patience, 3);
  EXPECT_THAT(ParseTrainConfig(kBase, "t.yaml", {"nonfinite_patience=0"}).status().message(),
              HasSubstr("nonfinite_patience: must be >= 1"));
}

// The config file, the directory check and the data path's resolution all go through the Env.
TEST(ConfigTest, LoadsThroughTheEnv) {
  std::unique_ptr<MemEnv> env = NewMemEnv();
  ASSERT_TRUE(env->CreateDir("/runs").ok());
  ASSERT_TRUE(env->CreateDir("/runs/exp").ok());
  ASSERT_TRUE(WriteStringToFile(env.get(), kBase, "/runs/exp/config.yaml").ok());
  ASSERT_TRUE(WriteStringToFile(env.get(), "x\n", "/runs/exp/d.csv").ok());
  absl::StatusOr<TrainConfig> c = LoadTrainConfig("/runs/exp/config.yaml", {}, nullptr, env.get());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->steps, 50);
  // d.csv is not in the current directory of the MemEnv, but beside the config.
  EXPECT_EQ(c->data.source, "/runs/exp/d.csv");
  absl::StatusOr<TrainConfig> dir = LoadTrainConfig("/runs/exp", {}, nullptr, env.get());
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dir.status().message(), HasSubstr("pass its config: /runs/exp/config.yaml"));
  absl::StatusOr<TrainConfig> missing = LoadTrainConfig("/runs/nope.yaml", {}, nullptr, env.get());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("/runs/nope.yaml"));
}

TEST(ConfigTest, ParamGroupsParseRoundTripAndNameBadEntries) {
  absl::StatusOr<TrainConfig> c = ParseTrainConfig(
      kBase, "t.yaml",
      {"optimizer.param_groups=[{match: \"blocks/*\", lr_scale: 0.1}, {match: patch_embed/*, "
       "freeze: true}]"});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->optimizer.param_groups.size(), 2u);
  EXPECT_EQ(c->optimizer.param_groups[0].match, "blocks/*");
  EXPECT_DOUBLE_EQ(c->optimizer.param_groups[0].lr_scale, 0.1);
  EXPECT_FALSE(c->optimizer.param_groups[0].freeze);
  EXPECT_TRUE(c->optimizer.param_groups[1].freeze);
  absl::StatusOr<TrainConfig> back = ParseTrainConfig(ConfigToYaml(*c), "resolved.yaml");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << ConfigToYaml(*c);
  EXPECT_EQ(ConfigToYaml(*back), ConfigToYaml(*c));
  // Groups change what is trained: part of the hash; none given keeps the hash of before.
  absl::StatusOr<TrainConfig> plain = ParseTrainConfig(kBase, "t.yaml");
  EXPECT_NE(ConfigHash(*c), ConfigHash(*plain));
  EXPECT_EQ(ConfigToYaml(*plain).find("param_groups"), std::string::npos);
  auto err = [](const std::string& groups) {
    absl::StatusOr<TrainConfig> c =
        ParseTrainConfig(kBase, "t.yaml", {"optimizer.param_groups=" + groups});
    return c.ok() ? std::string("OK") : std::string(c.status().message());
  };
  EXPECT_THAT(err("[{match: a, lr_scal: 2}]"),
              HasSubstr("optimizer.param_groups[0].lr_scal: unknown key (allowed: match, "
                        "lr_scale, freeze)"));
  EXPECT_THAT(err("[{lr_scale: 2}]"), HasSubstr("optimizer.param_groups[0].match: is required"));
  EXPECT_THAT(err("[{match: a}, {match: b, lr_scale: -1}]"),
              HasSubstr("optimizer.param_groups[1].lr_scale: must be a finite number >= 0"));
  EXPECT_THAT(err("{match: a}"), HasSubstr("optimizer.param_groups: expected a list of groups"));
  // A learning rate of 0 is a valid config (kiln train --validate-first refuses to run it).
  EXPECT_TRUE(ParseTrainConfig(kBase, "t.yaml", {"optimizer.lr=0"}).ok());
}

TEST(ConfigTest, PrefetchAutoIsTheDefaultAndHashesAsTwo) {
  absl::StatusOr<TrainConfig> c = ParseTrainConfig(kBase, "t.yaml");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->data.prefetch, -1);
  EXPECT_THAT(ConfigToYaml(*c), HasSubstr("prefetch: auto"));
  absl::StatusOr<TrainConfig> two = ParseTrainConfig(kBase, "t.yaml", {"data.prefetch=2"});
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->data.prefetch, 2);
  EXPECT_EQ(ConfigHash(*c), ConfigHash(*two));  // runs from before auto keep their hash
  absl::StatusOr<TrainConfig> back = ParseTrainConfig(ConfigToYaml(*c), "resolved.yaml");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data.prefetch, -1);
  absl::StatusOr<TrainConfig> bad = ParseTrainConfig(kBase, "t.yaml", {"data.prefetch=lots"});
  EXPECT_THAT(bad.status().message(),
              HasSubstr("data.prefetch: expected auto or a number of batches, got 'lots'"));
}

TEST(ConfigTest, WorkersAutoIsTheDefaultAndIsNotHashed) {
  absl::StatusOr<TrainConfig> c = ParseTrainConfig(kBase, "t.yaml");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->data.workers, -1);
  EXPECT_THAT(ConfigToYaml(*c), HasSubstr("workers: auto"));
  absl::StatusOr<TrainConfig> four = ParseTrainConfig(kBase, "t.yaml", {"data.workers=4"});
  ASSERT_TRUE(four.ok());
  EXPECT_EQ(four->data.workers, 4);
  EXPECT_EQ(ConfigHash(*c), ConfigHash(*four));  // who produces the batches, not which
  absl::StatusOr<TrainConfig> back = ParseTrainConfig(ConfigToYaml(*four), "resolved.yaml");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data.workers, 4);
  EXPECT_THAT(ParseTrainConfig(kBase, "t.yaml", {"data.workers=0"}).status().message(),
              HasSubstr("data.workers: must be auto or in [1, 64], got 0"));
  EXPECT_THAT(ParseTrainConfig(kBase, "t.yaml", {"data.workers=many"}).status().message(),
              HasSubstr("data.workers: expected auto or a number of threads, got 'many'"));
}

TEST(ConfigTest, AugmentParsesValidatesAgainstTheModelAndRoundTrips) {
  const std::vector<std::string> aug = {
      "model.kind=vit", "model.height=8", "model.width=8",
      "data.augment={random_crop: {size: [8, 8], padding: 1}, flip_horizontal: true, "
      "normalize: {mean: [0.5], std: [0.25]}}"};
  absl::StatusOr<TrainConfig> c = ParseTrainConfig(kBase, "t.yaml", aug);
  ASSERT_TRUE(c.ok()) << c.status();
  const AugmentSection& a = c->data.augment;
  EXPECT_TRUE(a.random_crop);
  EXPECT_EQ(a.padding, 1);
  EXPECT_TRUE(a.flip_horizontal);
  EXPECT_EQ(a.mean, std::vector<double>{0.5});
  absl::StatusOr<TrainConfig> back = ParseTrainConfig(ConfigToYaml(*c), "resolved.yaml");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << ConfigToYaml(*c);
  EXPECT_EQ(ConfigToYaml(*back), ConfigToYaml(*c));
  absl::StatusOr<TrainConfig> plain = ParseTrainConfig(kBase, "t.yaml");
  EXPECT_EQ(ConfigToYaml(*plain).find("augment"), std::string::npos);
  auto err = [&](const std::string& v) {
    std::vector<std::string> o = {"model.kind=vit", "data.augment=" + v};
    absl::StatusOr<TrainConfig> c = ParseTrainConfig(kBase, "t.yaml", o);
    return c.ok() ? std::string("OK") : std::string(c.status().message());
  };
  EXPECT_THAT(err("{random_crop: {size: [6, 6], padding: 1}}"),
              HasSubstr("data.augment.random_crop.size: must be the model's image size [8, 8]"));
  EXPECT_THAT(err("{normalize: {mean: [0.5, 0.5], std: [1, 1]}}"),
              HasSubstr("data.augment.normalize: mean and std need one value per channel "
                        "(model.channels 1)"));
  EXPECT_THAT(err("{normalize: {mean: [0.5], std: [0]}}"),
              HasSubstr("data.augment.normalize.std: must be > 0"));
  EXPECT_THAT(err("{flip: true}"), HasSubstr("data.augment.flip: unknown key"));
  EXPECT_EQ(err("{flip_horizontal: true}"), "OK");
}

}  // namespace
}  // namespace kiln::train
