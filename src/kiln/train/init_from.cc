#include "kiln/train/init_from.h"

#include <fnmatch.h>

#include <memory>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kiln/base/status.h"
#include "kiln/train/checkpoint.h"
#include "kiln/train/run_dir.h"

namespace kiln::train {
namespace {

std::string TypeText(const Tensor& t) {
  return absl::StrCat(std::string(DTypeName(t.dtype())), t.shape().ToString());
}

// Whether `name` is selected: some include pattern matches and no exclude pattern does.
bool Selected(const InitFromConfig& c, const std::string& name) {
  bool in = false;
  for (const std::string& p : c.include) in = in || GlobMatch(p, name);
  if (!in) return false;
  for (const std::string& p : c.exclude) {
    if (GlobMatch(p, name)) return false;
  }
  return true;
}

// The checkpoint `dir` names (see LoadInitFrom), read keeping only the tensors in `wanted`.
absl::StatusOr<Checkpoint> ReadInitCheckpoint(const std::string& dir,
                                              const std::set<std::string>& wanted, Env* env,
                                              std::vector<std::string>* notes) {
  const std::string clean = CleanPath(dir);
  CheckpointOptions copts;
  copts.env = env;
  copts.read_only = true;  // never change the run we read from
  int64_t step = ParseCheckpointDirName(Basename(clean));
  std::string root;
  if (step >= 0) {
    root = Dirname(clean).empty() ? "." : Dirname(clean);
  } else {
    absl::StatusOr<bool> is_dir = env->IsDirectory(clean);
    if (!is_dir.ok() || !*is_dir) {
      return absl::NotFoundError(absl::StrCat("init_from.checkpoint: ", dir,
                                              " is not a directory (give a run directory or its "
                                              "checkpoints/step_<N>)"));
    }
    root = JoinPath(clean, "checkpoints");
    if (!env->FileExists(root)) {
      return absl::NotFoundError(absl::StrCat(
          "init_from.checkpoint: ", dir,
          " has no checkpoints/ folder (give a run directory or its checkpoints/step_<N>)"));
    }
    copts.run_id = ReadRunJsonId(clean, env);  // "": a run from before run ids
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointManager> ckpt,
                        CheckpointManager::Open(root, copts));
  // Every tensor is verified; only the selected parameters come into memory.
  ckpt->RestoreOnly([&wanted](const std::string& name) { return wanted.count(name) > 0; });
  absl::StatusOr<Checkpoint> ck = step >= 0 ? ckpt->Restore(step) : ckpt->RestoreLatest();
  if (!ck.ok()) {
    return Annotate(ck.status(), absl::StrCat("init_from.checkpoint ", dir));
  }
  for (const std::string& n : ck->notes) notes->push_back(absl::StrCat("init_from: ", n));
  return ck;
}

}  // namespace

bool GlobMatch(const std::string& pattern, const std::string& name) {
  return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

std::string CheckpointNameFor(const std::string& name,
                              const std::map<std::string, std::string>& rename) {
  const std::string* best_from = nullptr;
  const std::string* best_to = nullptr;
  for (const auto& [from, to] : rename) {
    if (absl::StartsWith(name, to) && (best_to == nullptr || to.size() > best_to->size())) {
      best_from = &from;
      best_to = &to;
    }
  }
  if (best_to == nullptr) return name;
  return *best_from + name.substr(best_to->size());
}

absl::StatusOr<InitFromResult> LoadInitFrom(const InitFromConfig& c, const nn::ParamStore& like,
                                            Env* env) {
  if (env == nullptr) env = Env::Default();
  if (c.checkpoint.empty()) return absl::InvalidArgumentError("init_from.checkpoint is empty");
  std::set<std::string> wanted;  // checkpoint names
  for (const std::string& name : like.names()) {
    if (Selected(c, name)) wanted.insert(CheckpointNameFor(name, c.rename));
  }
  if (wanted.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "init_from: include ", absl::StrJoin(c.include, ", "), " less exclude ",
        c.exclude.empty() ? "(none)" : absl::StrJoin(c.exclude, ", "),
        " selects no parameter of the model (its parameters: ", absl::StrJoin(like.names(), ", "),
        ")"));
  }
  InitFromResult r;
  KILN_ASSIGN_OR_RETURN(Checkpoint ck, ReadInitCheckpoint(c.checkpoint, wanted, env, &r.notes));
  r.checkpoint = ck.path;
  r.step = ck.step;
  for (int i = 0; i < like.size(); ++i) {
    const std::string& name = like.names()[i];
    const Tensor& mine = like.value(i);
    if (!Selected(c, name)) {
      r.left.push_back(name);
      KILN_RETURN_IF_ERROR(r.params.Add(name, mine.Clone()));
      continue;
    }
    const std::string from = CheckpointNameFor(name, c.rename);
    const std::string as = from == name ? "" : absl::StrCat(" (checkpoint name '", from, "')");
    auto it = ck.tensors.find(from);
    if (it == ck.tensors.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "init_from: parameter '", name, "'", as, " is not in checkpoint ", ck.path,
          "; leave it at its initialisation with init_from.exclude, or map its name with "
          "init_from.rename"));
    }
    const Tensor& theirs = it->second;
    if (theirs.dtype() != mine.dtype() || !(theirs.shape() == mine.shape())) {
      return absl::InvalidArgumentError(
          absl::StrCat("init_from: tensor '", name, "'", as, " is ", TypeText(theirs),
                       " in checkpoint ", ck.path, " but ", TypeText(mine),
                       " in the model; exclude it (init_from.exclude) to "
                       "leave it at its initialisation"));
    }
    r.loaded.push_back(name);
    r.loaded_elements += mine.num_elements();
    KILN_RETURN_IF_ERROR(r.params.Add(name, theirs));  // shares the restored buffer
  }
  return r;
}

std::string InitFromResult::Summary() const {
  return absl::StrCat("init_from: loaded ", loaded.size(), " tensors (", loaded_elements,
                      " parameters) from ", checkpoint, ", left ", left.size(),
                      " at their initialisation", left.empty() ? "" : ": ",
                      absl::StrJoin(left, ", "));
}

nlohmann::json InitFromResult::ToJson() const {
  return {{"checkpoint", checkpoint},      {"step", step},     {"tensors", loaded.size()},
          {"parameters", loaded_elements}, {"loaded", loaded}, {"left", left}};
}

}  // namespace kiln::train
