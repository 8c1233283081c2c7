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
#ifndef KILN_SERVE_REPOSITORY_H_
#define KILN_SERVE_REPOSITORY_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
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
  ModelRepository(std::string root, ModelConfig defaults, runtime::Backend* backend,
                  ModelRegistry* registry);

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
  const std::string& root() const { return root_; }
  // The folder names under root.
  absl::StatusOr<std::vector<std::string>> ModelNames() const;

 private:
  const std::string root_;
  const ModelConfig defaults_;
  runtime::Backend* const backend_;
  ModelRegistry* const registry_;
  std::mutex load_mu_;  // one load or unload at a time
  mutable std::mutex mu_;
  std::map<std::string, std::string> failures_;  // model -> why its last load failed
};

}  // namespace kiln::serve

#endif  // KILN_SERVE_REPOSITORY_H_
