// Models by name and version: the registry the server serves from, and the model repository
// folder it loads (docs/serving.md, "Model repository"):
//
//   REPO/<model>/config.yaml        optional: batching and version policy (ParseModelConfig)
//   REPO/<model>/<version>/         a `kiln export` artifact; versions are positive integers
//                                   written without leading zeros (other folders are ignored)
//
//   ModelRegistry registry(&metrics);
//   ModelRepository repo("/srv/models", defaults, backend.get(), &registry);
//   repo.LoadAll();                      // every model; failures logged and kept in Index()
//   repo.Load("mlp");                    // (re)load: a failure keeps the versions serving
//   repo.Unload("mlp");
//   repo.Submit(ModelRepository::Job::kLoad, "mlp", [](absl::Status s) { ... });
//                                        // the same on the repository's loader thread: what the
//                                        // REST and gRPC repository endpoints call, so no I/O
//                                        // thread compiles
#ifndef KILN_SERVE_REPOSITORY_H_
#define KILN_SERVE_REPOSITORY_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "kiln/runtime/executable.h"
#include "kiln/serve/metrics.h"
#include "kiln/serve/served_model.h"

namespace kiln::serve {

struct ModelConfig {
  BatchingConfig batching;
  enum class VersionPolicy { kLatest, kAll, kSpecific };
  VersionPolicy policy = VersionPolicy::kLatest;
  int64_t num_versions = 1;       // kLatest: the highest N
  std::vector<int64_t> versions;  // kSpecific

  // Which of `available` (sorted) to serve.
  std::vector<int64_t> Select(const std::vector<int64_t>& available) const;
};

// YAML text (config.yaml) over `defaults`. InvalidArgument naming `where` and the key.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& text, const std::string& where,
                                             const ModelConfig& defaults);

class ModelRegistry {
 public:
  explicit ModelRegistry(ServerMetrics* metrics) : metrics_(metrics) {}
  // Adds or replaces name/version; wires its metrics.
  void Put(std::shared_ptr<ServedModel> model);
  // Removes and returns name/version (null if absent).
  std::shared_ptr<ServedModel> Remove(const std::string& name, const std::string& version);
  // `version` empty: the highest version. Null if absent.
  std::shared_ptr<ServedModel> Find(const std::string& name, const std::string& version) const;
  std::vector<std::string> Versions(const std::string& name) const;  // ascending
  std::vector<std::shared_ptr<ServedModel>> All() const;
  ModelMetrics* MetricsFor(const std::string& name, const std::string& version) {
    return metrics_->ForModel(name, version);
  }

 private:
  ServerMetrics* metrics_;
  mutable std::mutex mu_;
  // name -> numeric version -> model (a --model server's version "1" is 1)
  std::map<std::string, std::map<int64_t, std::shared_ptr<ServedModel>>> models_;
};

class ModelRepository {
 public:
  // `env` (borrowed; null: Env::Default()) reaches the folders and config.yaml files; the
  // version folders' files are read by ServedModel::Load.
  ModelRepository(std::string root, ModelConfig defaults, runtime::Backend* backend,
                  ModelRegistry* registry, Env* env = nullptr);
  ~ModelRepository();  // StopLoader()

  // Loads every model folder. OK even when some fail (they show as UNAVAILABLE in Index());
  // NotFound when `root` is not a folder.
  absl::Status LoadAll();
  // Loads (or reloads) one model: its config and the versions its policy selects. On any error
  // nothing changes (the versions serving keep serving). NotFound: no such model folder;
  // InvalidArgument: a bad config.yaml; else (a version that does not load, none selected) the
  // version's error, FailedPrecondition where that was NotFound (a missing file).
  absl::Status Load(const std::string& name);
  absl::Status Unload(const std::string& name);
  // One row of the repository index: a loaded version (READY), or a model found on disk with
  // no version loaded (UNAVAILABLE, version empty, with the reason).
  struct IndexEntry {
    std::string name, version, state, reason;
  };
  // Models and versions found on disk or loaded, by name then version; `ready_only`: READY only.
  // REST's /v2/repository/index and gRPC's RepositoryIndex both answer this.
  std::vector<IndexEntry> Index(bool ready_only) const;
  // Index() as JSON: [{"name", "version", "state"} | {"name", "state", "reason"}].
  std::string IndexJson(bool ready_only) const;
  // The loader: Load or Unload of `name` run on the repository's own thread (started on first
  // use), one job at a time, and `done` called there with its status once it finished; the
  // caller's thread never waits. A job for a model that has one queued or running already is
  // refused at once, `done` called here with Aborted ("model 'x' is already loading ..."): one
  // at a time per model. After CloseLoader, Unavailable ("... shutting down").
  enum class Job { kLoad, kUnload };
  void Submit(Job job, const std::string& name, std::function<void(absl::Status)> done);
  // Refuses new jobs and answers the queued ones Unavailable (here); the running one goes on.
  void CloseLoader();
  // CloseLoader, then waits for the running job (its `done` called) and joins the thread.
  // Idempotent.
  void StopLoader();
  // Jobs queued or running.
  int64_t jobs() const {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    return static_cast<int64_t>(busy_.size());
  }
  // Tests: called on the loader thread with the model's name before each job runs (to make a
  // load slow). Set it before the first Submit.
  void set_job_hook_for_testing(std::function<void(const std::string&)> hook) {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    job_hook_ = std::move(hook);
  }

  const std::string& root() const { return root_; }
  // The folder names under root.
  absl::StatusOr<std::vector<std::string>> ModelNames() const;

 private:
  const std::string root_;
  Env* const env_;
  const ModelConfig defaults_;
  runtime::Backend* const backend_;
  ModelRegistry* const registry_;
  std::mutex load_mu_;  // one load or unload at a time
  mutable std::mutex mu_;
  std::map<std::string, std::string> failures_;  // model -> why its last load failed

  struct Pending {
    Job job = Job::kLoad;
    std::string name;
    std::function<void(absl::Status)> done;
  };
  void LoaderLoop();
  mutable std::mutex jobs_mu_;
  std::condition_variable jobs_cv_;
  std::deque<Pending> queue_;   // under jobs_mu_
  std::set<std::string> busy_;  // models with a job queued or running, under jobs_mu_
  bool closed_ = false;         // under jobs_mu_
  std::thread loader_;          // started by the first Submit, under jobs_mu_
  std::function<void(const std::string&)> job_hook_;
};

}  // namespace kiln::serve

#endif  // KILN_SERVE_REPOSITORY_H_
