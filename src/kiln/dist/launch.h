// Launching a slice of N worker processes through OpenMPI's mpirun, and finding, inside one
// worker, which rank of the slice it is.
//
//   LaunchOptions o{.workers = 2, .cores = 2, .root = geteuid() == 0, .binary = "/usr/bin/kiln",
//                   .args = {"train", "cfg.yaml", "--workers", "2"}, .env = env};
//   KILN_ASSIGN_OR_RETURN(std::vector<std::string> argv, BuildMpirunCommand(o));
//   // mpirun --bind-to none -np 2 -x GLIBC_TUNABLES=glibc.malloc.mmap_max=0
//   //   -x OMP_NUM_THREADS=1 --allow-run-as-root /usr/bin/kiln train cfg.yaml
//
//   KILN_ASSIGN_OR_RETURN(RankInfo me, DetectRank(env));   // env: the CLI reads it once
//   if (me.size > 1) ... create an MpiCommunicator ...
//
// BuildMpirunCommand is the ONE place that builds the command line (`kiln train --dry-run`
// prints it): --bind-to none (ranks share the cores; binding each to one core pins OpenMP
// threads onto it), --oversubscribe when the workers outnumber the cores (mpirun refuses more
// ranks than slots otherwise), the glibc malloc tunable for the ranks (OpenMPI's per-call
// temporaries above 32 MiB are mmap-ed and page-faulted on every call without it: 0.3 GB/s
// instead of 5 GB/s), OMP_NUM_THREADS = max(1, cores / workers) unless the caller's environment
// sets it (then its value is forwarded), --allow-run-as-root as root, --timeout for a job
// timeout, --hostfile, then the same binary with the same arguments minus the launch flags
// (--workers, --hostfile, --job-timeout, --dry-run, and --max-restarts: restarting is the
// launcher's business), so that the ranks do not launch or supervise again.
//
// Libraries do not call getenv: both functions take the environment as a map.
#ifndef KILN_DIST_LAUNCH_H_
#define KILN_DIST_LAUNCH_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln::dist {

using Environment = std::map<std::string, std::string>;

struct LaunchOptions {
  int workers = 1;            // ranks to start (>= 1)
  std::string hostfile;       // mpirun --hostfile; "" = every rank on this host
  int64_t job_timeout_s = 0;  // mpirun --timeout: the whole job is killed after it; 0 = none
  int cores = 1;              // of this host (std::thread::hardware_concurrency)
  bool root = false;          // running as root: mpirun refuses unless --allow-run-as-root
  std::string mpirun = "mpirun";
  std::string srun = "srun";
  std::vector<std::string> slurm_args;  // passed to srun before the binary (--slurm-arg)
  std::string binary;                   // the worker binary (absolute path of this kiln)
  // This process's arguments after argv[0] (e.g. {"train", "cfg.yaml", "--workers", "2"}); the
  // launch flags are removed from them (StripLaunchFlags).
  std::vector<std::string> args;
  Environment env;  // this process's environment (for OMP_NUM_THREADS)
};

// The mpirun argv (argv[0] = options.mpirun). InvalidArgument for workers < 1, cores < 1, a
// negative timeout or an empty binary.
absl::StatusOr<std::vector<std::string>> BuildMpirunCommand(const LaunchOptions& options);

// The srun argv for `kiln train --slurm` (argv[0] = options.srun): `srun -n N --mpi=pmix -K`
// (PMIx: Debian's OpenMPI has no other Slurm PMI; -K: a rank that fails ends the step at once,
// where plain srun would leave the others blocked in a collective), --time from the job timeout
// (minutes, rounded up), --export=ALL plus the malloc tunable and, unless the caller set it,
// OMP_NUM_THREADS = max(1, cores / N), then options.slurm_args, the binary and the arguments
// minus the launch flags. Inside an allocation (sbatch, salloc) srun starts a job step in it;
// outside one it asks Slurm for one. InvalidArgument for workers < 1, a negative timeout, a
// hostfile (Slurm places ranks) or an empty binary.
absl::StatusOr<std::vector<std::string>> BuildSrunCommand(const LaunchOptions& options);

// `args` without --workers N / --workers=N, --hostfile F / --hostfile=F, --job-timeout S /
// --job-timeout=S, --max-restarts N / --max-restarts=N, --dry-run, --slurm and --slurm-arg A /
// --slurm-arg=A.
std::vector<std::string> StripLaunchFlags(const std::vector<std::string>& args);

// The command line as a shell would take it: words with characters outside [A-Za-z0-9_./=:,+-@%]
// are single-quoted.
std::string ShellJoin(const std::vector<std::string>& argv);

// Where this process sits in a job, from the launcher's environment variables.
struct RankInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;    // among the ranks on this host
  std::string launcher;  // "mpirun", "pmix", "slurm", or "" (not started by a launcher)
};

// Reads, in order of precedence: OpenMPI's OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK (mpirun),
// PMIx's PMIX_RANK (with OMPI_COMM_WORLD_SIZE or SLURM_NTASKS for the size; srun --mpi=pmix),
// Slurm's SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID (srun). None set: rank 0 of 1.
// InvalidArgument naming the variable for a value that is not a non-negative integer, a size
// < 1, or a rank (or local rank) not below the size.
absl::StatusOr<RankInfo> DetectRank(const Environment& env);

}  // namespace kiln::dist

#endif  // KILN_DIST_LAUNCH_H_
