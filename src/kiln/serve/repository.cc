#include "kiln/serve/repository.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kiln/base/env.h"
#include "kiln/base/log.h"
#include "kiln/base/status.h"
#include "kiln/serve/oip.h"

namespace kiln::serve {
namespace {

bool IsDir(Env* env, const std::string& path) {
  absl::StatusOr<bool> d = env->IsDirectory(path);
  return d.ok() && *d;
}

// The names of the folders in `dir`, sorted (none if it cannot be listed).
std::vector<std::string> Subfolders(Env* env, const std::string& dir) {
  std::vector<std::string> out;
  absl::StatusOr<std::vector<std::string>> children = env->GetChildren(dir);
  if (!children.ok()) return out;
  for (std::string& c : *children)
    if (IsDir(env, JoinPath(dir, c))) out.push_back(std::move(c));
  return out;
}

// A version folder name: a positive integer without leading zeros.
bool ParseVersion(const std::string& s, int64_t* v) {
  if (s.empty() || s.size() > 18 || s[0] == '0') return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  *v = std::stoll(s);
  return true;
}

absl::Status ApplyKey(const std::string& key, const YAML::Node& v, ModelConfig* c) {
  BatchingConfig& b = c->batching;
  if (key == "max_batch_size") {
    b.max_batch_size = v.as<int64_t>();
  } else if (key == "preferred_batch_sizes") {
    b.preferred_batch_sizes = v.as<std::vector<int64_t>>();
  } else if (key == "max_queue_delay_us") {
    b.max_queue_delay_us = v.as<int64_t>();
  } else if (key == "max_queue_size") {
    b.max_queue_size = v.as<int64_t>();
  } else if (key == "instances") {
    b.instances = v.as<int>();
  } else if (key == "default_timeout_us") {
    b.default_timeout_us = v.as<int64_t>();
  } else if (key == "priority_levels") {
    b.priority_levels = v.as<int64_t>();
  } else if (key == "default_priority_level") {
    b.default_priority_level = v.as<int64_t>();
  } else if (key == "preserve_ordering") {
    b.preserve_ordering = v.as<bool>();
  } else if (key == "version_policy") {
    const std::string p = v.as<std::string>();
    if (p == "latest") {
      c->policy = ModelConfig::VersionPolicy::kLatest;
    } else if (p == "all") {
      c->policy = ModelConfig::VersionPolicy::kAll;
    } else if (p == "specific") {
      c->policy = ModelConfig::VersionPolicy::kSpecific;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("version_policy: '", p, "' is not latest, all or specific"));
    }
  } else if (key == "num_versions") {
    c->num_versions = v.as<int64_t>();
  } else if (key == "versions") {
    c->versions = v.as<std::vector<int64_t>>();
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown key '", key,
        "' (known: max_batch_size, preferred_batch_sizes, max_queue_delay_us, max_queue_size, "
        "instances, default_timeout_us, priority_levels, default_priority_level, "
        "preserve_ordering, version_policy, num_versions, versions)"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int64_t> ModelConfig::Select(const std::vector<int64_t>& available) const {
  std::vector<int64_t> out;
  switch (policy) {
    case VersionPolicy::kAll:
      return available;
    case VersionPolicy::kLatest: {
      const int64_t n = std::min<int64_t>(num_versions, available.size());
      out.assign(available.end() - n, available.end());
      return out;
    }
    case VersionPolicy::kSpecific:
      for (int64_t v : available)
        if (std::find(versions.begin(), versions.end(), v) != versions.end()) out.push_back(v);
      return out;
  }
  return out;
}

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& text, const std::string& where,
                                             const ModelConfig& defaults) {
  ModelConfig c = defaults;
  try {
    YAML::Node root = YAML::Load(text);
    if (root.IsNull()) return c;
    if (!root.IsMap())
      return absl::InvalidArgumentError(absl::StrCat(where, ": expected a mapping of keys"));
    for (const auto& kv : root) {
      const std::string key = kv.first.as<std::string>();
      try {
        absl::Status s = ApplyKey(key, kv.second, &c);
        if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
      } catch (const YAML::Exception& e) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ":", e.mark.line + 1, ": ", key, ": wrong type (", e.msg, ")"));
      }
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(where, ":", e.mark.line + 1, ": ", e.msg));
  }
  absl::Status s = c.batching.Validate();
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
  if (c.policy == ModelConfig::VersionPolicy::kLatest && c.num_versions < 1)
    return absl::InvalidArgumentError(absl::StrCat(where, ": num_versions must be at least 1"));
  if (c.policy == ModelConfig::VersionPolicy::kSpecific && c.versions.empty())
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": version_policy specific needs a non-empty versions list"));
  return c;
}

// ---- ModelRegistry ----

void ModelRegistry::Put(std::shared_ptr<ServedModel> model) {
  int64_t v = 0;
  if (!ParseVersion(model->version(), &v)) v = 1;
  ModelMetrics* m = metrics_->ForModel(model->name(), model->version());
  model->set_batch_observer([m](const BatchStats& s) {
    m->compute.Observe(s.compute_us * 1e-6);
    m->batch_size.Observe(static_cast<double>(s.rows));
  });
  std::weak_ptr<ServedModel> weak = model;
  metrics_->SetQueueDepth(m, [weak]() -> int64_t {
    auto p = weak.lock();
    return p ? p->queue_depth() : 0;
  });
  std::lock_guard<std::mutex> lock(mu_);
  models_[model->name()][v] = std::move(model);
}

std::shared_ptr<ServedModel> ModelRegistry::Remove(const std::string& name,
                                                   const std::string& version) {
  int64_t v = 0;
  if (!ParseVersion(version, &v)) return nullptr;
  std::shared_ptr<ServedModel> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = models_.find(name);
    if (it == models_.end()) return nullptr;
    auto jt = it->second.find(v);
    if (jt == it->second.end()) return nullptr;
    out = std::move(jt->second);
    it->second.erase(jt);
    if (it->second.empty()) models_.erase(it);
  }
  metrics_->SetQueueDepth(metrics_->ForModel(name, version), nullptr);
  return out;
}

std::shared_ptr<ServedModel> ModelRegistry::Find(const std::string& name,
                                                 const std::string& version) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = models_.find(name);
  if (it == models_.end() || it->second.empty()) return nullptr;
  if (version.empty()) return it->second.rbegin()->second;
  int64_t v = 0;
  if (!ParseVersion(version, &v)) return nullptr;
  auto jt = it->second.find(v);
  return jt == it->second.end() ? nullptr : jt->second;
}

std::vector<std::string> ModelRegistry::Versions(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  auto it = models_.find(name);
  if (it != models_.end())
    for (const auto& [v, m] : it->second) out.push_back(m->version());
  return out;
}

std::vector<std::shared_ptr<ServedModel>> ModelRegistry::All() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<ServedModel>> out;
  for (const auto& [n, vs] : models_)
    for (const auto& [v, m] : vs) out.push_back(m);
  return out;
}

// ---- ModelRepository ----

ModelRepository::ModelRepository(std::string root, ModelConfig defaults, runtime::Backend* backend,
                                 ModelRegistry* registry, Env* env)
    : root_(std::move(root)),
      env_(env != nullptr ? env : Env::Default()),
      defaults_(std::move(defaults)),
      backend_(backend),
      registry_(registry) {}

ModelRepository::~ModelRepository() { StopLoader(); }

void ModelRepository::Submit(Job job, const std::string& name,
                             std::function<void(absl::Status)> done) {
  const char* what = job == Job::kLoad ? "loaded" : "unloaded";
  std::unique_lock<std::mutex> lock(jobs_mu_);
  if (closed_) {
    lock.unlock();
    done(absl::UnavailableError(
        absl::StrCat("the server is shutting down: model '", name, "' was not ", what)));
    return;
  }
  if (!busy_.insert(name).second) {
    lock.unlock();
    done(absl::AbortedError(absl::StrCat("model '", name,
                                         "' is already loading or unloading (a repository load or "
                                         "unload of it is running): not ",
                                         what, "; retry when that one answers")));
    return;
  }
  queue_.push_back(Pending{job, name, std::move(done)});
  if (!loader_.joinable()) loader_ = std::thread([this] { LoaderLoop(); });
  jobs_cv_.notify_one();
}

void ModelRepository::LoaderLoop() {
  for (;;) {
    Pending p;
    std::function<void(const std::string&)> hook;
    {
      std::unique_lock<std::mutex> lock(jobs_mu_);
      jobs_cv_.wait(lock, [this] { return closed_ || !queue_.empty(); });
      if (queue_.empty()) return;  // closed
      p = std::move(queue_.front());
      queue_.pop_front();
      hook = job_hook_;
    }
    if (hook) hook(p.name);
    absl::Status s = p.job == Job::kLoad ? Load(p.name) : Unload(p.name);
    {
      // Free before answering: a client told "done" may send the next job for it at once.
      std::lock_guard<std::mutex> lock(jobs_mu_);
      busy_.erase(p.name);
    }
    p.done(std::move(s));
  }
}

void ModelRepository::CloseLoader() {
  std::deque<Pending> refused;
  {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    closed_ = true;
    refused.swap(queue_);
    for (const Pending& p : refused) busy_.erase(p.name);
  }
  jobs_cv_.notify_all();
  for (Pending& p : refused) {
    p.done(absl::UnavailableError(absl::StrCat("the server is shutting down: model '", p.name,
                                               "' was not ",
                                               p.job == Job::kLoad ? "loaded" : "unloaded")));
  }
}

void ModelRepository::StopLoader() {
  CloseLoader();
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    t = std::move(loader_);
  }
  if (t.joinable()) t.join();
}

absl::StatusOr<std::vector<std::string>> ModelRepository::ModelNames() const {
  if (!IsDir(env_, root_))
    return absl::NotFoundError(absl::StrCat("model repository ", root_, " is not a folder"));
  std::vector<std::string> names;
  for (std::string& n : Subfolders(env_, root_))
    if (n[0] != '.') names.push_back(std::move(n));
  return names;
}

absl::Status ModelRepository::LoadAll() {
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> names, ModelNames());
  for (const std::string& n : names) {
    absl::Status s = Load(n);
    if (!s.ok()) KILN_LOG(WARNING) << "kiln serve: model " << n << " not loaded: " << s.message();
  }
  return absl::OkStatus();
}

absl::Status ModelRepository::Load(const std::string& name) {
  std::lock_guard<std::mutex> load_lock(load_mu_);
  // The model is there but does not load: NotFound only ever means "no such model" (a missing
  // file or version folder inside it is the model's problem, FailedPrecondition).
  auto fail = [&](absl::Status s) {
    if (s.code() == absl::StatusCode::kNotFound) s = absl::FailedPreconditionError(s.message());
    std::lock_guard<std::mutex> lock(mu_);
    failures_[name] = std::string(s.message());
    return s;
  };
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.' ||
      !IsDir(env_, JoinPath(root_, name)))
    return absl::NotFoundError(absl::StrCat("no model '", name, "' in repository ", root_));
  const std::string dir = JoinPath(root_, name);
  ModelConfig config = defaults_;
  const std::string config_path = JoinPath(dir, "config.yaml");
  if (env_->FileExists(config_path)) {
    absl::StatusOr<std::string> text = ReadFileToString(env_, config_path);
    if (!text.ok()) return fail(text.status());
    absl::StatusOr<ModelConfig> c = ParseModelConfig(*text, config_path, defaults_);
    if (!c.ok()) return fail(c.status());
    config = *c;
  }
  std::vector<int64_t> available;
  for (const std::string& n : Subfolders(env_, dir)) {
    int64_t v = 0;
    if (ParseVersion(n, &v)) available.push_back(v);
  }
  std::sort(available.begin(), available.end());
  const std::vector<int64_t> chosen = config.Select(available);
  if (chosen.empty()) {
    return fail(absl::NotFoundError(
        absl::StrCat("model '", name, "' has no version folder its version policy selects (found: ",
                     available.empty() ? "none" : absl::StrJoin(available, ", "), ")")));
  }
  // Load every chosen version first; only then swap, so a failure changes nothing.
  std::vector<std::shared_ptr<ServedModel>> loaded;
  for (int64_t v : chosen) {
    absl::StatusOr<std::unique_ptr<ServedModel>> m = ServedModel::Load(
        JoinPath(dir, std::to_string(v)), name, std::to_string(v), config.batching, backend_);
    if (!m.ok()) {
      for (auto& l : loaded) l->Stop();
      return fail(m.status());
    }
    loaded.push_back(std::move(*m));
  }
  std::set<std::string> keep;
  for (auto& m : loaded) keep.insert(m->version());
  std::vector<std::shared_ptr<ServedModel>> old;
  for (const std::string& v : registry_->Versions(name)) {
    auto m = v.empty() ? nullptr : registry_->Find(name, v);
    if (m != nullptr) old.push_back(m);
    if (!keep.count(v)) registry_->Remove(name, v);
  }
  for (auto& m : loaded) registry_->Put(m);
  for (auto& m : old) m->Stop();  // the replaced versions finish what they queued
  std::lock_guard<std::mutex> lock(mu_);
  failures_.erase(name);
  return absl::OkStatus();
}

absl::Status ModelRepository::Unload(const std::string& name) {
  std::lock_guard<std::mutex> load_lock(load_mu_);
  std::vector<std::string> versions = registry_->Versions(name);
  if (versions.empty())
    return absl::NotFoundError(absl::StrCat("model '", name, "' is not loaded"));
  for (const std::string& v : versions)
    if (auto m = registry_->Remove(name, v)) m->Stop();
  std::lock_guard<std::mutex> lock(mu_);
  failures_.erase(name);  // the index says "not loaded", not an earlier reload's failure
  return absl::OkStatus();
}

std::vector<ModelRepository::IndexEntry> ModelRepository::Index(bool ready_only) const {
  std::vector<IndexEntry> entries;
  absl::StatusOr<std::vector<std::string>> names = ModelNames();
  std::set<std::string> all;
  if (names.ok()) all.insert(names->begin(), names->end());
  for (const auto& m : registry_->All()) all.insert(m->name());
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& n : all) {
    std::vector<std::string> versions = registry_->Versions(n);
    for (const std::string& v : versions) entries.push_back({n, v, "READY", ""});
    if (versions.empty() && !ready_only) {
      auto f = failures_.find(n);
      entries.push_back({n, "", "UNAVAILABLE", f != failures_.end() ? f->second : "not loaded"});
    }
  }
  return entries;
}

std::string ModelRepository::IndexJson(bool ready_only) const {
  std::vector<std::string> out;
  for (const IndexEntry& e : Index(ready_only)) {
    std::string j = "{\"name\":";
    AppendJsonString(e.name, &j);
    if (!e.version.empty()) {
      j += ",\"version\":";
      AppendJsonString(e.version, &j);
    }
    j += ",\"state\":";
    AppendJsonString(e.state, &j);
    if (!e.reason.empty()) {
      j += ",\"reason\":";
      AppendJsonString(e.reason, &j);
    }
    j += "}";
    out.push_back(std::move(j));
  }
  return "[" + absl::StrJoin(out, ",") + "]";
}

}  // namespace kiln::serve
