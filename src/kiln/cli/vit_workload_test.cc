// Workload 1 (docs/workloads.md "1. ViT fine-tuning") end to end, shortened: import Debian's
// Adwaita icons at 1x8x8, pretrain examples/vit_pretrain.yaml on the digits, fine-tune
// examples/vit_finetune.yaml on the icons from that checkpoint (init_from without the head,
// param_groups freezing the patch embedding and slowing the backbone), and the from-scratch
// variant. Checks what each run's checkpoint holds, tensor by tensor. Skipped where the icons are
// not installed (adwaita-icon-theme).
#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/cli/internal/test_util.h"
#include "kiln/train/checkpoint.h"

namespace kiln::cli {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr char kIcons[] = "/usr/share/icons/Adwaita/48x48";

std::string Example(const std::string& name) {
  return std::string(KILN_SOURCE_DIR) + "/examples/" + name;
}

train::Checkpoint Load(const std::string& run, int64_t step) {
  auto m = train::CheckpointManager::Open(run + "/checkpoints", {});
  EXPECT_TRUE(m.ok()) << m.status();
  auto c = (*m)->Restore(step);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : train::Checkpoint();
}

std::string Bytes(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw_data()), t.byte_size());
}

TEST(VitWorkload, PretrainThenFineTuneLoadsTheBackboneByNameAndFreezesWhatItSays) {
  if (!fs::is_directory(kIcons)) GTEST_SKIP() << kIcons << " is not installed";
  const std::string dir = ::testing::TempDir() + "/vit_workload";
  fs::remove_all(dir);
  const std::string icons = dir + "/icons";
  KilnResult imp = Kiln({"data", "import", "images", kIcons, "--out", icons, "--size", "8x8",
                         "--channels", "1", "--held-out", "0.2", "--quiet"});
  ASSERT_EQ(imp.code, 0) << imp.err;
  const std::vector<std::string> shorten = {"--set", "eval_every=0", "--set", "checkpoint_every=0",
                                            "--set", "log_every=10"};
  auto train = [&](const std::string& config, const std::string& out, int steps,
                   std::vector<std::string> extra) {
    std::vector<std::string> args = {"train", Example(config), "--output-dir",
                                     out,     "--set",         "steps=" + std::to_string(steps)};
    args.insert(args.end(), shorten.begin(), shorten.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return Kiln(args);
  };
  KilnResult pre = train("vit_pretrain.yaml", dir + "/pre", 30, {});
  ASSERT_EQ(pre.code, 0) << pre.out << pre.err;
  const std::vector<std::string> on_icons = {"--set", "data.source=dataset:" + icons};
  std::vector<std::string> ft_args = on_icons;
  ft_args.insert(ft_args.end(), {"--set", "init_from.checkpoint=" + dir + "/pre"});
  KilnResult ft = train("vit_finetune.yaml", dir + "/ft", 12, ft_args);
  ASSERT_EQ(ft.code, 0) << ft.out << ft.err;
  EXPECT_THAT(ft.out, HasSubstr("init_from: loaded"));
  std::vector<std::string> scratch_args = on_icons;
  scratch_args.insert(scratch_args.end(),
                      {"--set", "init_from.checkpoint=\"\"", "--set", "optimizer.param_groups=[]"});
  KilnResult scratch = train("vit_finetune.yaml", dir + "/scratch", 12, scratch_args);
  ASSERT_EQ(scratch.code, 0) << scratch.out << scratch.err;
  EXPECT_THAT(scratch.out, ::testing::Not(HasSubstr("init_from: loaded")));

  const train::Checkpoint p = Load(dir + "/pre", 30);
  const train::Checkpoint f = Load(dir + "/ft", 12);
  const train::Checkpoint s = Load(dir + "/scratch", 12);
  ASSERT_FALSE(p.tensors.empty());
  ASSERT_FALSE(f.tensors.empty());
  // Frozen and loaded: the patch embedding is the pretrained one, bit for bit, with no state.
  for (const char* name : {"patch_embed/weight", "patch_embed/bias"}) {
    EXPECT_EQ(Bytes(f.tensors.at(name)), Bytes(p.tensors.at(name))) << name;
    EXPECT_EQ(f.tensors.count(std::string("opt/m/") + name), 0u) << name;
    EXPECT_NE(Bytes(s.tensors.at(name)), Bytes(p.tensors.at(name))) << name;  // scratch trains it
  }
  // Loaded, then trained at a tenth of the rate: moved, but only a little.
  const Tensor& w_pre = p.tensors.at("blocks/0/mlp/c_fc/weight");
  const Tensor& w_ft = f.tensors.at("blocks/0/mlp/c_fc/weight");
  ASSERT_EQ(w_pre.shape(), w_ft.shape());
  EXPECT_NE(Bytes(w_ft), Bytes(w_pre));
  EXPECT_EQ(f.tensors.count("opt/m/blocks/0/mlp/c_fc/weight"), 1u);
  double moved = 0, size = 0;
  for (int64_t i = 0; i < w_pre.num_elements(); ++i) {
    moved += std::abs(w_ft.GetDouble(i) - w_pre.GetDouble(i));
    size += std::abs(w_pre.GetDouble(i));
  }
  EXPECT_LT(moved, 0.2 * size);
  // A new head: 11 icon labels instead of 10 digits.
  EXPECT_EQ(p.tensors.at("head/weight").shape().num_elements(), 64 * 10);
  EXPECT_EQ(f.tensors.at("head/weight").shape().num_elements(), 11 * 64);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln::cli
