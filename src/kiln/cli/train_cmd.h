// `kiln train`, `kiln eval` and `kiln export`: the training stack on the command line
// (docs/train.md, docs/cli.md). app.cc registers them with one object:
//
//   CLI::App app{...};
//   TrainCommands train_cmds(app);        // adds the three subcommands and their flags
//   app.parse(argc, argv);
//   if (int rc = train_cmds.Run(args, out, err); rc >= 0) return rc;   // -1: not one of them
//
// Exit codes: 0 done; 1 failed (bad config, I/O, ...); 3 refused by --validate-first; 75
// (EX_TEMPFAIL) stopped by SIGTERM/SIGINT after committing a checkpoint: rerun the same command to
// resume.
#ifndef KILN_CLI_TRAIN_CMD_H_
#define KILN_CLI_TRAIN_CMD_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "kiln/dist/communicator.h"
#include "kiln/train/config.h"
#include "kiln/train/trainer.h"

namespace kiln::cli {

class TrainCommands {
 public:
  explicit TrainCommands(CLI::App& app);

  // The exit code of the chosen subcommand, or -1 if none of these was chosen.
  int Run(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

 private:
  int RunTrain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
  // `--workers N`: runs (or with --dry-run prints) the mpirun command that starts the ranks.
  int Launch(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
  // Trains as one process or as one rank of a job (`comm`: null for one process).
  int RunRank(const std::vector<std::string>& args, dist::Communicator* comm, std::ostream& out,
              std::ostream& err);
  // --validate-first N before the run: -1 to go on, else the exit status (3: refused).
  int ValidateBeforeRun(const train::TrainConfig& config, const train::TrainerOptions& opts,
                        dist::Communicator* comm, std::ostream& out, std::ostream& err);
  int RunEval(std::ostream& out, std::ostream& err);
  int RunExport(std::ostream& out, std::ostream& err);

  CLI::App* train_ = nullptr;
  CLI::App* eval_ = nullptr;
  CLI::App* export_ = nullptr;

  std::string config_path_;
  std::vector<std::string> sets_;
  int max_restarts_ = 0;
  std::string profile_steps_;
  std::string output_dir_;
  std::string init_from_;  // --init-from DIR: init_from.checkpoint
  std::string backend_ = "cpu";
  bool no_resume_ = false;
  int64_t validate_first_ = 0;  // --validate-first N (train/validate_first.h)
  bool replace_ = false;
  // Multi-process (docs/distributed.md): launch N ranks through mpirun, or run as one of them.
  int workers_ = 0;
  std::string hostfile_;
  int64_t job_timeout_s_ = 0;
  bool dry_run_ = false;
  bool slurm_ = false;
  std::vector<std::string> slurm_args_;
  double collective_timeout_s_ = 60;

  std::string checkpoint_;  // eval / export: OUTDIR or OUTDIR/checkpoints/step_N
  std::string eval_config_;
  std::vector<std::string> eval_sets_;
  int64_t eval_batches_ = 0;
  std::string export_out_;
  int64_t export_batch_ = 1;
  std::string export_format_ = "kiln";
  bool export_overwrite_ = false;
};

}  // namespace kiln::cli

#endif  // KILN_CLI_TRAIN_CMD_H_
