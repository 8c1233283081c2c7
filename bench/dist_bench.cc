// All-reduce bandwidth: Kiln's MpiCommunicator::AllReduce (f32 sum, in place; both MpiReduction
// modes) against raw MPI_Allreduce and raw MPI_Iallreduce + MPI_Wait on the same buffers,
// alternating call by call
// (DESIGN.md §5: peers in the same run, ratios of medians). Run under mpirun with the malloc
// tunable (deps-and-data.md §4: without it OpenMPI's per-call temporaries above 32 MiB page-fault):
//
//   mpirun --allow-run-as-root --bind-to none -np 2
//     -x GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1073741824
//     build/bench/dist_bench --out=bench/out/dist.json          (make bench-dist does this)
//
// Each timed call is preceded by an MPI_Barrier; a call's time is the slowest rank's (max over
// ranks, reduced after the loop). algbw = message bytes / time.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "kiln/dist/mpi/mpi_communicator.h"

namespace {

using Clock = std::chrono::steady_clock;

// kiln: the default MpiReduction::kRankOrder; kiln_mpi: MpiReduction::kMpi (MPI_Iallreduce
// polled against the timeout).
enum Peer { kKiln = 0, kKilnMpi = 1, kRawAllreduce = 2, kRawIallreduce = 3, kNumPeers = 4 };

struct Comms {
  kiln::dist::MpiCommunicator* rank_order;
  kiln::dist::MpiCommunicator* mpi;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double TimeOne(Peer peer, const Comms& comms, float* data, int count) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = Clock::now();
  if (peer == kKiln || peer == kKilnMpi) {
    kiln::dist::MpiCommunicator& comm = peer == kKiln ? *comms.rank_order : *comms.mpi;
    absl::Status s = comm.AllReduce(data, count, kiln::DType::kF32, kiln::dist::ReduceOp::kSum);
    if (!s.ok()) {
      std::fprintf(stderr, "dist_bench: %s\n", s.ToString().c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  } else if (peer == kRawAllreduce) {
    MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  } else {
    MPI_Request request;
    MPI_Iallreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &request);
    MPI_Wait(&request, MPI_STATUS_IGNORE);
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Row {
  int mib;
  int reps;
  double seconds[kNumPeers];
};

Row Measure(const Comms& comm, int mib, int reps) {
  const int count = mib * (1 << 20) / 4;
  // Small values: 2 ranks double them each call, and they must stay finite over every call.
  std::vector<float> data(count, 1e-6f);
  for (int p = 0; p < kNumPeers; ++p)  // 2 untimed calls each: connections, temporaries
    for (int w = 0; w < 2; ++w) TimeOne(static_cast<Peer>(p), comm, data.data(), count);
  std::vector<double> times[kNumPeers];
  for (int rep = 0; rep < reps; ++rep)
    for (int p = 0; p < kNumPeers; ++p) {
      std::fill(data.begin(), data.end(), 1e-6f);
      times[p].push_back(TimeOne(static_cast<Peer>(p), comm, data.data(), count));
    }
  Row row{mib, reps, {}};
  for (int p = 0; p < kNumPeers; ++p) {
    std::vector<double> slowest(times[p].size());
    MPI_Allreduce(times[p].data(), slowest.data(), static_cast<int>(slowest.size()), MPI_DOUBLE,
                  MPI_MAX, MPI_COMM_WORLD);
    row.seconds[p] = Median(slowest);
  }
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  // --out=FILE: the JSON; --mib=N: one size only; --reps=N: timed calls per peer and size.
  std::string out;
  int only_mib = 0, reps_flag = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--out=", 6) == 0) out = argv[i] + 6;
    if (std::strncmp(argv[i], "--mib=", 6) == 0) only_mib = std::atoi(argv[i] + 6);
    if (std::strncmp(argv[i], "--reps=", 7) == 0) reps_flag = std::atoi(argv[i] + 7);
  }
  auto comm = kiln::dist::MpiCommunicator::Create();
  auto comm_mpi = kiln::dist::MpiCommunicator::Create(kiln::dist::kDefaultCollectiveTimeout,
                                                      kiln::dist::MpiReduction::kMpi);
  if (!comm.ok() || !comm_mpi.ok()) {
    std::fprintf(stderr, "dist_bench: %s %s\n", comm.status().ToString().c_str(),
                 comm_mpi.status().ToString().c_str());
    return 1;
  }
  const Comms comms{comm->get(), comm_mpi->get()};
  const int rank = (*comm)->rank(), size = (*comm)->size();
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  std::vector<Row> rows;
  for (auto [mib, reps] : {std::pair{1, 41}, {16, 21}, {64, 11}, {256, 7}})
    if (only_mib == 0 || mib == only_mib)
      rows.push_back(Measure(comms, mib, reps_flag > 0 ? reps_flag : reps));
  if (rank == 0) {
    std::string json = "{\n  \"bench\": \"dist_allreduce_f32_sum\",\n";
    json += "  \"ranks\": " + std::to_string(size) + ",\n";
    json += std::string("  \"glibc_tunables\": \"") + (tunables ? tunables : "") + "\",\n";
    json +=
        "  \"time\": \"median over reps of the slowest rank's call, seconds\",\n  \"rows\": [\n";
    std::printf("%-6s %-5s %10s %10s %10s %10s %9s %9s\n", "MiB", "reps", "kiln GB/s", "kiln_mpi",
                "allreduce", "iallred", "kiln/raw", "kmpi/raw");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      const double bytes = static_cast<double>(r.mib) * (1 << 20);
      double gbps[kNumPeers];
      for (int p = 0; p < kNumPeers; ++p) gbps[p] = bytes / r.seconds[p] / 1e9;
      std::printf("%-6d %-5d %10.2f %10.2f %10.2f %10.2f %9.3f %9.3f\n", r.mib, r.reps, gbps[0],
                  gbps[1], gbps[2], gbps[3], gbps[0] / gbps[2], gbps[1] / gbps[2]);
      char line[512];
      std::snprintf(line, sizeof(line),
                    "    {\"mib\": %d, \"reps\": %d, \"kiln_gbps\": %.4g, \"kiln_mpi_gbps\": %.4g, "
                    "\"mpi_allreduce_gbps\": %.4g, \"mpi_iallreduce_gbps\": %.4g, "
                    "\"kiln_over_mpi_allreduce\": %.4f, \"kiln_mpi_over_mpi_allreduce\": %.4f}%s\n",
                    r.mib, r.reps, gbps[0], gbps[1], gbps[2], gbps[3], gbps[0] / gbps[2],
                    gbps[1] / gbps[2], i + 1 < rows.size() ? "," : "");
      json += line;
    }
    json += "  ]\n}\n";
    if (!out.empty()) {
      std::ofstream(out) << json;
      std::printf("wrote %s\n", out.c_str());
    }
  }
  comm_mpi->reset();
  comm->reset();
  return 0;
}
