// `kiln train --max-restarts N`: a parent process that runs the training command as a worker
// child and restarts it when it dies abnormally, so a run on preemptible or flaky capacity finishes
// on its own. Each restart resumes from the newest committed checkpoint (the trainer does that by
// itself), so at most the steps since that checkpoint are recomputed.
//
//   if (max_restarts > 0 && !IsSupervisedWorker(getenv(kWorkerEnvVar))) {  // the CLI reads it
//     return RunSupervised(argv, {.max_restarts = max_restarts}, std::cerr);
//   }
//   ... train as usual (this process is the worker) ...
//
// The worker is /proc/self/exe re-executed with the same argv and the environment variable
// KILN_TRAIN_WORKER=1. Restarted: a worker killed by a signal (SIGKILL, SIGSEGV, ...) or one
// that exited with 75 (preempted) while the supervisor itself was not asked to stop. Not
// restarted: exit 0 (done), other exit codes (bad config, usage: retrying cannot help). SIGTERM /
// SIGINT sent to the supervisor are forwarded to the worker (which runs in its own process group,
// so a terminal's Ctrl-C reaches it once, through the supervisor); it checkpoints and exits 75,
// and the supervisor then exits 75 too.
#ifndef KILN_TRAIN_SUPERVISOR_H_
#define KILN_TRAIN_SUPERVISOR_H_

#include <ostream>
#include <string>
#include <vector>

namespace kiln::train {

inline constexpr char kWorkerEnvVar[] = "KILN_TRAIN_WORKER";

struct SupervisorOptions {
  int max_restarts = 0;
  std::string executable = "/proc/self/exe";
  double restart_delay_seconds = 0.5;  // between a death and the restart
};

// True in a worker started by RunSupervised, given the value of kWorkerEnvVar in this process's
// environment (nullptr when unset). The caller (the CLI) reads the environment: libraries do not.
bool IsSupervisedWorker(const char* worker_env_value);

// Runs `argv` (argv[0] is passed through as the worker's argv[0]) as a supervised worker and
// returns the exit status for the supervisor: the worker's last exit code, 128 + signal if it was
// last killed by a signal and the restarts ran out, or 71 (EX_OSERR) if it cannot start.
int RunSupervised(const std::vector<std::string>& argv, const SupervisorOptions& options,
                  std::ostream& log);

}  // namespace kiln::train

#endif  // KILN_TRAIN_SUPERVISOR_H_
