#include "kiln/compiler/pipeline.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/log.h"
#include "kiln/base/status.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/verifier.h"

namespace kiln::compiler {
namespace {

std::string FileSafe(const std::string& path) {
  std::string out = path;
  for (char& c : out)
    if (c == '/') c = '.';
  return out;
}

// A graph name as a folder name: letters, digits, '_', '-' and '.' kept, anything else '_'.
std::string FolderSafe(const std::string& name) {
  std::string out = name.empty() ? "graph" : name;
  for (char& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') c = '_';
  }
  if (out == "." || out == "..") out = "graph";
  return out;
}

// Numbers the dump folders of every Run in this process (dump_dir/0001-<graph>/...).
std::atomic<int> dump_sequence{0};

std::string JoinNames(const std::vector<std::string>& names) {
  std::string list;
  for (const std::string& k : names) list += (list.empty() ? "" : ", ") + k;
  return list;
}

}  // namespace

// The options as one Run uses them, and the dump counter.
struct Pipeline::RunState {
  bool verify = false;
  std::set<std::string> disabled;
  std::string dump_dir;
  Env* env = nullptr;
  int dump_index = 0;
  bool dump_failed = false;
};

Pipeline::Pipeline(std::string name, PipelineOptions options)
    : name_(std::move(name)), options_(std::move(options)) {}

Pipeline& Pipeline::AddPass(std::unique_ptr<Pass> pass) {
  Entry e;
  e.passes.push_back(std::move(pass));
  entries_.push_back(std::move(e));
  return *this;
}

Pipeline& Pipeline::AddFixedPointGroup(std::string name,
                                       std::vector<std::unique_ptr<Pass>> passes) {
  Entry e;
  e.group = std::move(name);
  e.passes = std::move(passes);
  entries_.push_back(std::move(e));
  return *this;
}

std::vector<std::string> Pipeline::PassNames() const {
  std::vector<std::string> names;
  for (const Entry& e : entries_) {
    if (!e.group.empty()) names.push_back(e.group);
    for (const auto& p : e.passes) names.push_back(p->name());
  }
  return names;
}

void Pipeline::Dump(const std::string& when, const std::string& path, int round,
                    const ir::Graph& graph, RunState& st) {
  if (st.dump_dir.empty() || st.dump_failed) return;
  std::string file = JoinPath(
      st.dump_dir, absl::StrFormat("%03d-%s-%s.ir", st.dump_index++, when, FileSafe(path)));
  std::string text = absl::StrCat("# kiln IR dump: ", when, " ", path);
  if (round > 0) absl::StrAppend(&text, " (round ", round, ")");
  absl::StrAppend(&text, ", pipeline ", name_, ", graph ", graph.name(), "\n",
                  ir::PrintGraph(graph));
  absl::Status s = WriteStringToFile(st.env, text, file);
  if (!s.ok()) {
    st.dump_failed = true;  // one report per run, not one per pass
    dump_status_ = Annotate(s, "KILN_DUMP_IR: cannot write " + file);
    KILN_LOG(WARNING) << dump_status_.ToString() << " (IR dumps for this run stop here)";
  }
}

absl::StatusOr<bool> Pipeline::RunPass(Pass& pass, const std::string& path, int round, RunState& st,
                                       ir::Graph& graph) {
  PassRecord rec;
  rec.name = path;
  rec.round = round;
  rec.nodes_before = rec.nodes_after = graph.num_nodes();
  if (st.disabled.count(pass.name())) {
    rec.skipped = true;
    records_.push_back(rec);
    return false;
  }
  Dump("before", path, round, graph, st);
  auto start = std::chrono::steady_clock::now();
  absl::StatusOr<bool> changed = pass.Run(graph);
  rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!changed.ok()) return Annotate(changed.status(), "pass " + path);
  if (st.verify) {
    absl::Status v = ir::Verify(graph);
    if (!v.ok()) {
      return absl::InternalError(
          absl::StrCat("pass ", path, " produced an invalid graph: ", std::string(v.message())));
    }
  }
  Dump("after", path, round, graph, st);
  rec.changed = *changed;
  rec.nodes_after = graph.num_nodes();
  records_.push_back(rec);
  return *changed;
}

absl::Status Pipeline::CheckDisabledPasses() const {
  std::vector<std::string> known = PassNames();
  for (const std::string& k : options_.optional_pass_names) {
    if (std::find(known.begin(), known.end(), k) == known.end()) known.push_back(k);
  }
  for (const std::string& d : options_.disabled_passes) {
    if (std::find(known.begin(), known.end(), d) == known.end()) {
      return absl::InvalidArgumentError("pipeline " + name_ + ": cannot disable unknown pass '" +
                                        d + "' (passes: " + JoinNames(known) + ")");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Pipeline::Run(ir::Graph& graph) {
  records_.clear();
  dump_status_ = absl::OkStatus();
  KILN_RETURN_IF_ERROR(CheckDisabledPasses());

  RunState st;
  st.verify = options_.verify_each_pass;
  st.dump_dir = options_.dump_dir;
  st.env = options_.env != nullptr ? options_.env : Env::Default();
  st.disabled.insert(options_.disabled_passes.begin(), options_.disabled_passes.end());
  if (!st.dump_dir.empty()) {
    // This run's own folder: the next number whose folder does not exist yet (an earlier process
    // may have dumped into the same dir).
    const std::string graph_part = FolderSafe(graph.name());
    std::string folder;
    do {
      folder = JoinPath(st.dump_dir, absl::StrFormat("%04d-%s", ++dump_sequence, graph_part));
    } while (st.env->FileExists(folder));
    absl::Status s = st.env->CreateDir(folder);
    if (!s.ok()) {
      st.dump_failed = true;
      dump_status_ = Annotate(s, "KILN_DUMP_IR: cannot create " + folder);
      KILN_LOG(WARNING) << dump_status_.ToString() << " (no IR dumps)";
    }
    st.dump_dir = folder;
  }

  KILN_RETURN_IF_ERROR(Annotate(ir::Verify(graph), "pipeline " + name_ + ": input graph"));
  ir::Graph work = graph;
  bool changed = false;
  for (Entry& e : entries_) {
    if (e.group.empty()) {
      KILN_ASSIGN_OR_RETURN(bool c, RunPass(*e.passes[0], e.passes[0]->name(), 0, st, work));
      changed = changed || c;
      continue;
    }
    PassRecord group;
    group.name = e.group;
    group.nodes_before = work.num_nodes();
    if (st.disabled.count(e.group)) {
      group.skipped = true;
      group.nodes_after = group.nodes_before;
      records_.push_back(group);
      continue;
    }
    size_t group_at = records_.size();
    records_.push_back(group);  // filled in below, kept before its passes
    Dump("before", e.group, 0, work, st);
    auto start = std::chrono::steady_clock::now();
    bool group_changed = false;
    for (int round = 1;; ++round) {
      bool round_changed = false;
      for (auto& p : e.passes) {
        KILN_ASSIGN_OR_RETURN(bool c, RunPass(*p, e.group + "/" + p->name(), round, st, work));
        round_changed = round_changed || c;
      }
      group_changed = group_changed || round_changed;
      records_[group_at].round = round;
      if (!round_changed) break;
      if (round >= options_.max_fixed_point_rounds) {
        KILN_LOG(WARNING) << "pipeline " << name_ << ": group " << e.group
                          << " still changes the graph after " << round << " rounds; stopping";
        break;
      }
    }
    records_[group_at].seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    records_[group_at].changed = group_changed;
    records_[group_at].nodes_after = work.num_nodes();
    Dump("after", e.group, 0, work, st);
    changed = changed || group_changed;
  }
  graph = std::move(work);
  return changed;
}

std::string Pipeline::Summary() const {
  std::string out = absl::StrFormat("pipeline %s\n", name_);
  for (const PassRecord& r : records_) {
    absl::StrAppendFormat(&out, "  %-28s",
                          r.name + (r.round > 0 && r.name.find('/') != std::string::npos
                                        ? " #" + std::to_string(r.round)
                                        : ""));
    if (r.skipped) {
      out += " disabled\n";
      continue;
    }
    absl::StrAppendFormat(&out, " %5d -> %5d nodes %s %8.3f ms", r.nodes_before, r.nodes_after,
                          r.changed ? "changed  " : "unchanged", r.seconds * 1e3);
    if (r.round > 0 && r.name.find('/') == std::string::npos)
      absl::StrAppendFormat(&out, " (%d rounds)", r.round);
    out += "\n";
  }
  return out;
}

}  // namespace kiln::compiler
