#include "kiln/cli/serve_cmd.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kiln/base/status.h"
#include "kiln/cli/app.h"
#include "kiln/cli/backends.h"
#include "kiln/serve/repository.h"
#include "kiln/serve/server.h"
#ifdef KILN_HAVE_GRPC
#include "kiln/serve/grpc_server.h"
#endif

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;

serve::BatchingConfig Batching(const ServeOptions& o) {
  serve::BatchingConfig c;
  c.max_batch_size = o.max_batch;
  c.preferred_batch_sizes = o.preferred_batch;
  c.max_queue_delay_us = o.max_queue_delay_us;
  c.max_queue_size = o.queue_size;
  c.instances = o.instances;
  c.default_timeout_us = o.default_timeout_us;
  c.priority_levels = o.priority_levels;
  return c;
}

absl::Status CheckFlags(const ServeOptions& o) {
  if (o.model.empty() == o.repository.empty())
    return absl::InvalidArgumentError(
        "give exactly one of --model DIR and --model-repository REPO");
  if (!o.name.empty() && o.model.empty())
    return absl::InvalidArgumentError("--name goes with --model (a repository names its models)");
  if (o.port < 0 || o.port > 65535)
    return absl::InvalidArgumentError(absl::StrCat("--port ", o.port, " is outside 0..65535"));
  if (o.max_body_mib < 1 || o.max_body_mib > 4096)
    return absl::InvalidArgumentError(
        absl::StrCat("--max-body-mib ", o.max_body_mib, " is outside 1..4096"));
  if (o.idle_timeout_s < 1 || o.read_timeout_s < 1)
    return absl::InvalidArgumentError("--idle-timeout-s and --read-timeout-s must be >= 1");
  if (o.access_log_sample < 0 || o.access_log_sample > 1)
    return absl::InvalidArgumentError(
        absl::StrCat("--access-log-sample ", o.access_log_sample, " is outside [0, 1]"));
  if (o.max_connections < 1) return absl::InvalidArgumentError("--max-connections must be >= 1");
  if (o.grpc_port < -1 || o.grpc_port > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("--grpc-port ", o.grpc_port, " is outside -1..65535 (-1: off)"));
#ifndef KILN_HAVE_GRPC
  if (o.grpc_port >= 0)
    return absl::FailedPreconditionError(
        "--grpc-port: this kiln was built without gRPC (install libgrpc++-dev, libprotobuf-dev, "
        "protobuf-compiler and protobuf-compiler-grpc, then reconfigure and rebuild)");
#endif
  absl::Status s = Batching(o).Validate();
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("batching flags: ", s.message()));
  return absl::OkStatus();
}

}  // namespace

absl::Status RunServe(const ServeOptions& o, std::ostream& out) {
  KILN_RETURN_IF_ERROR(CheckFlags(o));
  // SIGTERM and SIGINT are taken by sigwait below: block them before any thread starts, so
  // every thread inherits the mask; restored when serving ends.
  sigset_t signals, old_mask;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, &old_mask);
  struct Restore {
    sigset_t* mask;
    ~Restore() { pthread_sigmask(SIG_SETMASK, mask, nullptr); }
  } restore{&old_mask};

  std::unique_ptr<std::ofstream> log_file;
  serve::ServerOptions so;
  so.http.host = o.host;
  so.http.port = o.port;
  so.http.threads = o.threads;
  so.http.max_body_bytes = o.max_body_mib << 20;
  so.http.idle_timeout_ms = o.idle_timeout_s * 1000;
  so.http.read_timeout_ms = o.read_timeout_s * 1000;
  so.http.max_connections = o.max_connections;
  so.server_version = KilnVersion();
  so.access_log_sample = o.access_log_sample;
  if (o.access_log == "-") {
    so.access_log = &out;
  } else if (!o.access_log.empty()) {
    log_file = std::make_unique<std::ofstream>(o.access_log, std::ios::app);
    if (!*log_file)
      return absl::InvalidArgumentError(
          absl::StrCat("--access-log ", o.access_log, ": cannot open for appending"));
    so.access_log = log_file.get();
  }

  KILN_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Backend> backend, MakeBackendByName(o.backend));
  // The repository outlives the server (declared first: destroyed last), whose Shutdown stops
  // its loader.
  std::unique_ptr<serve::ModelRepository> repo;
  serve::InferenceServer server(so);
  if (!o.model.empty()) {
    std::string name = o.name;
    if (name.empty()) name = fs::path(o.model).lexically_normal().filename().string();
    if (name.empty() || name == "." || name == "..") name = "model";
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<serve::ServedModel> m,
                          serve::ServedModel::Load(o.model, name, "1", Batching(o), backend.get()));
    server.registry().Put(std::move(m));
  } else {
    serve::ModelConfig defaults;
    defaults.batching = Batching(o);
    repo = std::make_unique<serve::ModelRepository>(o.repository, defaults, backend.get(),
                                                    &server.registry());
    KILN_RETURN_IF_ERROR(repo->LoadAll());
    server.set_repository(repo.get());
  }
  KILN_RETURN_IF_ERROR(server.Start());
  out << "kiln serve: listening on http://" << o.host << ":" << server.port() << "\n";
#ifdef KILN_HAVE_GRPC
  std::unique_ptr<serve::GrpcServer> grpc;  // drained by server.Shutdown with REST
  if (o.grpc_port >= 0) {
    serve::GrpcServerOptions g;
    g.host = o.host;
    g.port = o.grpc_port;
    g.max_message_bytes = std::min<int64_t>(o.max_body_mib << 20, INT32_MAX);  // gRPC's int
    absl::StatusOr<std::unique_ptr<serve::GrpcServer>> started =
        serve::GrpcServer::Start(&server, g);
    if (!started.ok()) {
      server.Shutdown(0);
      return started.status();
    }
    grpc = std::move(*started);
    out << "kiln serve: gRPC listening on " << o.host << ":" << grpc->port() << "\n";
  }
#endif
  for (const auto& m : server.registry().All()) {
    out << "kiln serve: model " << m->name() << " version " << m->version() << " from " << m->dir()
        << " (batch sizes " << absl::StrJoin(m->compiled_sizes(), ",") << ", "
        << m->config().instances << (m->config().instances == 1 ? " instance" : " instances")
        << (m->normalization() ? "; inputs normalized as in training: data.augment.normalize" : "")
        << ") ready\n";
  }
  out << std::flush;
  int sig = 0;
  sigwait(&signals, &sig);
  out << "kiln serve: " << (sig == SIGTERM ? "SIGTERM" : "SIGINT")
      << ": draining (in-flight requests finish)\n"
      << std::flush;
  server.Shutdown(o.drain_timeout_s * 1000);
  out << "kiln serve: stopped\n" << std::flush;
  return absl::OkStatus();
}

ServeCommand::ServeCommand(CLI::App& app) {
  cmd_ = app.add_subcommand(
      "serve",
      "Serve `kiln export` artifacts over the Open Inference Protocol (KServe v2 REST, and "
      "gRPC with --grpc-port)");
  ServeOptions& o = options_;
  cmd_->add_option("--model", o.model, "Serve one artifact directory (version 1)");
  cmd_->add_option("--name", o.name, "Model name for --model (default: the directory's name)");
  cmd_->add_option("--model-repository", o.repository,
                   "Serve a model repository: REPO/<model>/<version>/ artifacts, optional "
                   "REPO/<model>/config.yaml");
  cmd_->add_option("--host", o.host, "Address to listen on")->capture_default_str();
  cmd_->add_option("--port", o.port, "Port (0: pick one; the bound port is printed)")
      ->capture_default_str();
  cmd_->add_option("--backend", o.backend, "Backend: cpu (oneDNN) or reference")
      ->check(CLI::IsMember(BackendNames()))
      ->capture_default_str();
  cmd_->add_option("--max-batch", o.max_batch, "Most rows per batch")->capture_default_str();
  cmd_->add_option("--preferred-batch", o.preferred_batch,
                   "Preferred batch sizes, comma-separated (each is compiled, as is --max-batch)")
      ->delimiter(',');
  cmd_->add_option("--max-queue-delay-us", o.max_queue_delay_us,
                   "Longest a request waits for a batch to fill, from the oldest queued request")
      ->capture_default_str();
  cmd_->add_option("--queue-size", o.queue_size, "Most queued requests per model (0: unbounded)")
      ->capture_default_str();
  cmd_->add_option("--instances", o.instances, "Model instances (worker threads) per model")
      ->capture_default_str();
  cmd_->add_option("--default-timeout-us", o.default_timeout_us,
                   "Queue timeout of requests without a lower `timeout` parameter (0: none)")
      ->capture_default_str();
  cmd_->add_option("--priority-levels", o.priority_levels,
                   "Priority levels (a request's `priority` is 1 = highest .. this)")
      ->capture_default_str();
  cmd_->add_option("--threads", o.threads, "HTTP I/O threads")->capture_default_str();
  cmd_->add_option("--max-body-mib", o.max_body_mib, "Largest request body (MiB); larger: 413")
      ->capture_default_str();
  cmd_->add_option("--idle-timeout-s", o.idle_timeout_s,
                   "Close a keep-alive connection idle this long")
      ->capture_default_str();
  cmd_->add_option("--read-timeout-s", o.read_timeout_s,
                   "Close a connection whose request takes longer than this to arrive")
      ->capture_default_str();
  cmd_->add_option("--max-connections", o.max_connections, "Open connections at most")
      ->capture_default_str();
  cmd_->add_option("--grpc-port", o.grpc_port,
                   "Also serve gRPC (inference.GRPCInferenceService) on this port: -1 off, 0 pick "
                   "one (printed); messages up to --max-body-mib")
      ->capture_default_str();
  cmd_->add_option("--drain-timeout-s", o.drain_timeout_s,
                   "On SIGTERM/SIGINT, wait at most this long for in-flight requests")
      ->capture_default_str();
  cmd_->add_option("--access-log", o.access_log,
                   "Append one JSON line per request to this file (- for stdout)");
  cmd_->add_option("--access-log-sample", o.access_log_sample,
                   "Fraction of requests the access log records (evenly spread)")
      ->capture_default_str();
}

int ServeCommand::Run(std::ostream& out, std::ostream& err) {
  if (!*cmd_) return -1;
  absl::Status s = RunServe(options_, out);
  if (s.ok()) return 0;
  err << "kiln serve: " << s.message() << "\n";
  return 1;
}

}  // namespace kiln::cli
