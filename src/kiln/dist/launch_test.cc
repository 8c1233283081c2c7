#include "kiln/dist/launch.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::dist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

LaunchOptions Base() {
  LaunchOptions o;
  o.workers = 2;
  o.cores = 2;
  o.binary = "/opt/kiln";
  o.args = {"train", "cfg.yaml", "--workers", "2", "--set", "steps=5"};
  return o;
}

TEST(LaunchTest, BuildsTheMpirunCommand) {
  absl::StatusOr<std::vector<std::string>> argv = BuildMpirunCommand(Base());
  ASSERT_TRUE(argv.ok()) << argv.status();
  EXPECT_THAT(*argv,
              ElementsAre("mpirun", "--bind-to", "none", "-np", "2", "-x",
                          "GLIBC_TUNABLES=glibc.malloc.mmap_max=0", "-x", "OMP_NUM_THREADS=1",
                          "/opt/kiln", "train", "cfg.yaml", "--set", "steps=5"));
}

TEST(LaunchTest, OversubscribesRootHostfileTimeoutAndThreads) {
  LaunchOptions o = Base();
  o.workers = 4;
  o.root = true;
  o.job_timeout_s = 600;
  std::vector<std::string> argv = *BuildMpirunCommand(o);
  std::string line = ShellJoin(argv);
  EXPECT_THAT(line, HasSubstr("--oversubscribe"));
  EXPECT_THAT(line, HasSubstr("--allow-run-as-root"));
  EXPECT_THAT(line, HasSubstr("--timeout 600"));
  EXPECT_THAT(line, HasSubstr("OMP_NUM_THREADS=1 "));  // max(1, 2 / 4)
  o.cores = 16;
  line = ShellJoin(*BuildMpirunCommand(o));
  EXPECT_THAT(line, ::testing::Not(HasSubstr("--oversubscribe")));
  EXPECT_THAT(line, HasSubstr("OMP_NUM_THREADS=4 "));
  // A hostfile counts the slots: no --oversubscribe from this host's core count.
  o.cores = 2;
  o.hostfile = "hosts.txt";
  line = ShellJoin(*BuildMpirunCommand(o));
  EXPECT_THAT(line, HasSubstr("--hostfile hosts.txt"));
  EXPECT_THAT(line, ::testing::Not(HasSubstr("--oversubscribe")));
  // The user's OMP_NUM_THREADS is forwarded, not replaced.
  o.env = {{"OMP_NUM_THREADS", "3"}};
  argv = *BuildMpirunCommand(o);
  EXPECT_THAT(ShellJoin(argv), HasSubstr("-x OMP_NUM_THREADS "));
  EXPECT_THAT(ShellJoin(argv), ::testing::Not(HasSubstr("OMP_NUM_THREADS=")));
  o.root = false;
  EXPECT_THAT(ShellJoin(*BuildMpirunCommand(o)), ::testing::Not(HasSubstr("--allow-run-as-root")));
}

TEST(LaunchTest, StripsOnlyTheLaunchFlags) {
  EXPECT_THAT(StripLaunchFlags({"train", "c.yaml", "--workers=2", "--hostfile", "h", "--dry-run",
                                "--job-timeout", "30", "--set", "steps=1", "--hostfile=x",
                                "--job-timeout=5", "--max-restarts", "3", "--workersx"}),
              ElementsAre("train", "c.yaml", "--set", "steps=1", "--workersx"));
}

TEST(LaunchTest, RejectsBadOptions) {
  LaunchOptions o = Base();
  o.workers = 0;
  EXPECT_THAT(std::string(BuildMpirunCommand(o).status().message()), HasSubstr("--workers"));
  o = Base();
  o.job_timeout_s = -1;
  EXPECT_THAT(std::string(BuildMpirunCommand(o).status().message()), HasSubstr("--job-timeout"));
  o = Base();
  o.binary = "";
  EXPECT_FALSE(BuildMpirunCommand(o).ok());
}

TEST(LaunchTest, BuildsTheSrunCommand) {
  LaunchOptions o = Base();
  o.job_timeout_s = 61;
  o.slurm_args = {"--partition=debug"};
  absl::StatusOr<std::vector<std::string>> argv = BuildSrunCommand(o);
  ASSERT_TRUE(argv.ok()) << argv.status();
  const std::string line = ShellJoin(*argv);
  EXPECT_THAT(line,
              HasSubstr("srun -n 2 --mpi=pmix -K --time=2 "
                        "--export=ALL,GLIBC_TUNABLES=glibc.malloc.mmap_max=0,OMP_NUM_THREADS=1 "
                        "--partition=debug /opt/kiln train cfg.yaml --set steps=5"));
  EXPECT_THAT(line, ::testing::Not(HasSubstr("--workers")));
  o.args = {"train", "cfg.yaml", "--workers", "2", "--slurm", "--slurm-arg", "-N2"};
  EXPECT_THAT(ShellJoin(*BuildSrunCommand(o)), ::testing::EndsWith("/opt/kiln train cfg.yaml"));
  o.env["OMP_NUM_THREADS"] = "4";  // the caller's value travels in ALL
  EXPECT_THAT(ShellJoin(*BuildSrunCommand(o)), ::testing::Not(HasSubstr("OMP_NUM_THREADS=")));
  o.hostfile = "hosts";
  EXPECT_THAT(std::string(BuildSrunCommand(o).status().message()), HasSubstr("--hostfile"));
}

TEST(LaunchTest, ShellJoinQuotes) {
  EXPECT_EQ(ShellJoin({"a", "b c", "it's", "x=1", ""}), "a 'b c' 'it'\\''s' x=1 ''");
}

TEST(DetectRankTest, NoLauncherIsRankZeroOfOne) {
  RankInfo r = *DetectRank({{"HOME", "/root"}});
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.size, 1);
  EXPECT_EQ(r.local_rank, 0);
  EXPECT_EQ(r.launcher, "");
}

TEST(DetectRankTest, OpenMpi) {
  RankInfo r = *DetectRank({{"OMPI_COMM_WORLD_RANK", "3"},
                            {"OMPI_COMM_WORLD_SIZE", "4"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                            {"PMIX_RANK", "3"},
                            {"SLURM_PROCID", "0"}});
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.size, 4);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.launcher, "mpirun");
}

TEST(DetectRankTest, PmixUnderSrun) {
  RankInfo r = *DetectRank(
      {{"PMIX_RANK", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "1"}, {"SLURM_LOCALID", "1"}});
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.size, 2);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.launcher, "pmix");
}

TEST(DetectRankTest, Slurm) {
  RankInfo r = *DetectRank({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}});
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.size, 8);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.launcher, "slurm");
}

TEST(DetectRankTest, BadValuesNameTheVariable) {
  auto msg = [](const Environment& env) { return std::string(DetectRank(env).status().message()); };
  EXPECT_THAT(msg({{"OMPI_COMM_WORLD_RANK", "x"}, {"OMPI_COMM_WORLD_SIZE", "2"}}),
              HasSubstr("OMPI_COMM_WORLD_RANK='x'"));
  EXPECT_THAT(msg({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}}),
              HasSubstr("not below OMPI_COMM_WORLD_SIZE=2"));
  EXPECT_THAT(msg({{"SLURM_PROCID", "0"}}), HasSubstr("SLURM_NTASKS"));
  EXPECT_THAT(msg({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "0"}}), HasSubstr(">= 1"));
  EXPECT_THAT(msg({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "-1"}}),
              HasSubstr("SLURM_LOCALID"));
}

}  // namespace
}  // namespace kiln::dist
