#include "kiln/train/supervisor.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace kiln::train {
namespace {

volatile sig_atomic_t g_forward_signal = 0;
volatile pid_t g_worker = 0;

void Forward(int sig) {
  g_forward_signal = sig;
  if (g_worker > 0) kill(g_worker, sig);
}

}  // namespace

bool IsSupervisedWorker(const char* worker_env_value) {
  return worker_env_value != nullptr && worker_env_value[0] == '1';
}

int RunSupervised(const std::vector<std::string>& argv, const SupervisorOptions& options,
                  std::ostream& log) {
  struct sigaction sa = {}, old_term = {}, old_int = {};
  sa.sa_handler = Forward;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGINT, &sa, &old_int);

  int restarts = 0;
  int result = 0;
  while (true) {
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = fork();
    if (pid < 0) {
      log << "kiln train: cannot fork the worker: " << strerror(errno) << "\n";
      result = 71;
      break;
    }
    if (pid == 0) {
      // Its own process group: a terminal's Ctrl-C reaches only the supervisor, which forwards
      // it once (two SIGINTs would make the worker's handler kill it at once).
      setpgid(0, 0);
      // If the supervisor dies (even by SIGKILL), the worker checkpoints and stops.
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      setenv(kWorkerEnvVar, "1", 1);
      execv(options.executable.c_str(), args.data());
      _exit(71);
    }
    g_worker = pid;
    if (g_forward_signal) kill(pid, g_forward_signal);  // a signal that raced the fork
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
      if (errno != EINTR) {
        status = -1;
        break;
      }
    }
    g_worker = 0;
    bool restartable = false;
    std::string what;
    if (status == -1) {
      what = "was lost (waitpid failed)";
      result = 71;
    } else if (WIFSIGNALED(status)) {
      int sig = WTERMSIG(status);
      what =
          std::string("was killed by signal ") + std::to_string(sig) + " (" + strsignal(sig) + ")";
      result = 128 + sig;
      restartable = true;
    } else {
      result = WEXITSTATUS(status);
      what = "exited with status " + std::to_string(result);
      restartable = result == 75;
      if (result == 71) restartable = false;  // could not exec
    }
    if (result == 0) break;
    if (g_forward_signal) {
      log << "kiln train: worker " << what << " after a forwarded stop signal; not restarting\n";
      break;
    }
    if (!restartable) {
      log << "kiln train: worker " << what << "; not restartable\n";
      break;
    }
    if (restarts >= options.max_restarts) {
      log << "kiln train: worker " << what << "; no restarts left (--max-restarts "
          << options.max_restarts << ")\n";
      break;
    }
    ++restarts;
    log << "kiln train: worker " << what << "; restart " << restarts << " of "
        << options.max_restarts << " from the latest checkpoint\n"
        << std::flush;
    std::this_thread::sleep_for(std::chrono::duration<double>(options.restart_delay_seconds));
    if (g_forward_signal) break;
  }
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGINT, &old_int, nullptr);
  return result;
}

}  // namespace kiln::train
