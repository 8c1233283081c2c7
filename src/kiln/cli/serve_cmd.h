// `kiln serve`: the Open Inference Protocol (KServe v2) server (docs/serving.md).
//
//   kiln serve --model /tmp/mlp --port 8000 --max-batch 8 --preferred-batch 4,8
//   kiln serve --model-repository /srv/models --port 0      # prints the port it bound
//   kiln serve --model /tmp/mlp --grpc-port 8001            # gRPC beside REST
//
// Startup prints the address and every model version loaded, then serves until SIGTERM or
// SIGINT: the listener closes, requests already read are answered, queued batches run, exit 0.
//
// app.cc registers it like the other commands:
//
//   ServeCommand serve_cmd(app);
//   app.parse(argc, argv);
//   if (int rc = serve_cmd.Run(out, err); rc >= 0) return rc;   // -1: not chosen
#ifndef KILN_CLI_SERVE_CMD_H_
#define KILN_CLI_SERVE_CMD_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"

namespace kiln::cli {

struct ServeOptions {
  std::string model;       // one artifact directory
  std::string name;        // its model name (default: the directory's name)
  std::string repository;  // or a model repository
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string backend = "cpu";
  // Batching (for --model; the defaults of models without config.yaml in a repository).
  int64_t max_batch = 8;
  std::vector<int64_t> preferred_batch;
  int64_t max_queue_delay_us = 0;
  int64_t queue_size = 0;
  int instances = 1;
  int64_t default_timeout_us = 0;
  int64_t priority_levels = 1;
  // HTTP.
  int threads = 2;
  int64_t max_body_mib = 64;
  int64_t idle_timeout_s = 60;
  int64_t read_timeout_s = 30;
  int max_connections = 1024;
  // gRPC (inference.GRPCInferenceService) on its own port: -1 off, 0 the kernel picks one.
  int grpc_port = -1;
  int64_t drain_timeout_s = 30;
  std::string access_log;  // file, "-" for stdout, empty: none
  double access_log_sample = 1.0;
};

// Serves until SIGTERM/SIGINT; errors (bad flags, a model that does not load, a port in use)
// before serving. Writes the startup lines to `out`.
absl::Status RunServe(const ServeOptions& options, std::ostream& out);

class ServeCommand {
 public:
  explicit ServeCommand(CLI::App& app);
  // The exit code (0, or 1 with "kiln serve: <message>" on err), or -1 if not chosen.
  int Run(std::ostream& out, std::ostream& err);

 private:
  CLI::App* cmd_ = nullptr;
  ServeOptions options_;
};

}  // namespace kiln::cli

#endif  // KILN_CLI_SERVE_CMD_H_
