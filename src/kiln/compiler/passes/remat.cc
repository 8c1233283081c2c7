#include "kiln/compiler/passes/remat.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "kiln/base/status.h"
#include "kiln/compiler/execution_plan.h"
#include "kiln/compiler/graph_editor.h"
#include "kiln/compiler/passes/fusion.h"
#include "kiln/compiler/passes/schedule.h"

namespace kiln::compiler {
namespace {

bool IsSource(const ir::Node& n) {
  return n.opcode() == ir::Opcode::kParameter || n.opcode() == ir::Opcode::kConstant;
}

// Memory-bound work cheap enough to redo: elementwise ops and broadcasts.
bool Cheap(const ir::Node& n) {
  return ir::OpcodeKind(n.opcode()) == ir::OpKind::kElementwise ||
         n.opcode() == ir::Opcode::kBroadcastInDim;
}

struct Candidate {
  int value = -1;
  std::vector<int> late_users;
  int insert_before = -1;  // node id the copies go in front of
  std::vector<int> chain;  // nodes to copy, operands first; ends with `value`
  int64_t new_peak = 0;
  int64_t area_saved = 0;  // byte-steps freed minus byte-steps added
};

// The live-bytes profile of a graph in id order and the candidates it offers.
class Analysis {
 public:
  Analysis(const ir::Graph& g, const RematOptions& options, const BackendTraits& traits)
      : g_(g),
        options_(options),
        plan_(PlanExecution(g, traits)),
        iv_(LiveIntervals(g, plan_)),  // plan_ is declared (so initialized) before iv_
        users_(g.num_nodes()),
        output_(g.num_nodes(), 0) {
    const int n = g.num_nodes();
    for (const ir::Node& node : g.nodes())
      for (int o : node.operands())
        if (users_[o].empty() || users_[o].back() != node.id()) users_[o].push_back(node.id());
    for (const ir::Output& o : g.outputs()) output_[o.node] = 1;
    std::vector<int64_t> delta(n + 2, 0);
    for (const LiveInterval& v : iv_) {
      if (v.bytes == 0) continue;
      delta[v.start] += v.bytes;
      delta[v.end + 1] -= v.bytes;
    }
    live_.assign(n + 1, 0);
    int64_t l = 0;
    for (int t = 0; t <= n; ++t) {
      l += delta[t];
      live_[t] = l;
      peak_ = std::max(peak_, l);
    }
  }

  int64_t peak() const { return peak_; }

  std::vector<Candidate> Candidates() const {
    std::vector<Candidate> out;
    for (const ir::Node& node : g_.nodes()) {
      Candidate c;
      if (Evaluate(node.id(), &c)) out.push_back(std::move(c));
    }
    return out;
  }

 private:
  // The first id of the kernel node `id` belongs to (its fusion group's first member).
  int KernelStart(int id) const {
    int k = plan_.group_of[id];
    return k < 0 ? id : plan_.groups[k].members.front();
  }

  bool Evaluate(int v, Candidate* c) const {
    const ir::Node& node = g_.node(v);
    if (!Cheap(node) || IsSource(node) || output_[v] || iv_[v].bytes == 0) return false;
    // Reader steps, sorted; the late readers follow the widest gap.
    std::vector<int> steps;
    for (int u : users_[v]) steps.push_back(iv_[u].start);
    std::sort(steps.begin(), steps.end());
    steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
    int prev = iv_[v].start, best_gap = -1, split = -1;
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps[i] - prev > best_gap) {
        best_gap = steps[i] - prev;
        split = static_cast<int>(i);
      }
      prev = steps[i];
    }
    if (split < 0 || best_gap < options_.min_gap) return false;
    const int near_end = split == 0 ? iv_[v].start : steps[split - 1];
    const int site = steps[split];
    if (site - near_end - 1 <= 0) return false;

    c->value = v;
    c->insert_before = std::numeric_limits<int>::max();
    for (int u : users_[v]) {
      if (iv_[u].start < site) continue;
      c->late_users.push_back(u);
      c->insert_before = std::min(c->insert_before, KernelStart(u));
    }
    // Changes to the profile: [from, to] += bytes.
    struct Range {
      int from, to;
      int64_t bytes;
    };
    std::vector<Range> ranges = {{near_end + 1, site - 1, -iv_[v].bytes}};
    int64_t area = iv_[v].bytes * (site - near_end - 1);
    int64_t transient = 0;
    std::vector<char> in_chain(g_.num_nodes(), 0);
    std::vector<char> extended(g_.num_nodes(), 0);
    // Copies `x` after whatever it needs: recomputed cheap operands first.
    auto need = [&](auto&& self, int x, int depth) -> void {
      for (int o : g_.node(x).operands()) {
        const ir::Node& on = g_.node(o);
        if (IsSource(on) || in_chain[o] || extended[o]) continue;
        if (iv_[o].bytes > 0 && iv_[o].end >= site) continue;  // live there anyway
        if (Cheap(on) && depth < options_.max_chain && !output_[o]) {
          in_chain[o] = 1;
          self(self, o, depth + 1);
          c->chain.push_back(o);
          transient += ArenaBytes(on.type());
          continue;
        }
        extended[o] = 1;
        int64_t bytes = ArenaBytes(on.type());
        int from = iv_[o].bytes > 0 ? iv_[o].end + 1 : iv_[o].start;
        ranges.push_back({from, site, bytes});
        area -= bytes * (site - from + 1);
      }
    };
    in_chain[v] = 1;
    need(need, v, 0);
    c->chain.push_back(v);
    area -= transient;
    // The peak with those changes (copies counted at the site, where they are made).
    const int n = g_.num_nodes();
    std::vector<int64_t> delta(n + 2, 0);
    for (const Range& r : ranges) {
      if (r.from > r.to) continue;
      delta[r.from] += r.bytes;
      delta[r.to + 1] -= r.bytes;
    }
    delta[site] += transient;
    delta[site + 1] -= transient;
    int64_t d = 0, peak = 0;
    for (int t = 0; t <= n; ++t) {
      d += delta[t];
      peak = std::max(peak, live_[t] + d);
    }
    c->new_peak = peak;
    c->area_saved = area;
    return true;
  }

  const ir::Graph& g_;
  const RematOptions& options_;
  ExecutionPlan plan_;
  std::vector<LiveInterval> iv_;
  std::vector<std::vector<int>> users_;  // distinct, in id order
  std::vector<char> output_;
  std::vector<int64_t> live_;  // bytes live at each step
  int64_t peak_ = 0;
};

// `g` with the candidate's copies placed before `insert_before` and its late users reading them.
absl::StatusOr<ir::Graph> Apply(const ir::Graph& g, const Candidate& c) {
  GraphEditor e(g);
  e.set_dead_code(GraphEditor::DeadCode::kKeep);  // the original may be dead now: it stays
  e.set_position(c.insert_before);
  std::vector<int> copy(g.num_nodes(), -1);
  for (int x : c.chain) {
    const ir::Node& s = g.node(x);
    std::vector<int> ops;
    for (int o : s.operands()) ops.push_back(copy[o] >= 0 ? copy[o] : o);
    ir::AttrMap attrs = s.attrs();
    attrs.erase(kFusionAttr);  // a copy belongs to no group
    copy[x] = e.AddCopy(s, std::move(ops), std::move(attrs));
  }
  for (int u : c.late_users) {
    const std::vector<int>& ops = g.node(u).operands();
    for (int i = 0; i < static_cast<int>(ops.size()); ++i)
      if (ops[i] == c.value) KILN_RETURN_IF_ERROR(e.SetOperand(u, i, copy[c.value]));
  }
  return std::move(e).Build();
}

std::string MiB(int64_t bytes) {
  if (bytes < (int64_t{1} << 20)) return absl::StrFormat("%.1f KiB", bytes / 1024.0);
  return absl::StrFormat("%.1f MiB", bytes / 1048576.0);
}

}  // namespace

std::string RematReport::ToString() const {
  std::string s = absl::StrFormat("remat: %d values recomputed (+%d nodes); peak %s -> %s",
                                  recomputed, added_nodes, MiB(peak_before), MiB(peak_after));
  if (memory_limit_bytes > 0) {
    s += absl::StrFormat("; needs %s -> %s, limit %s: %s", MiB(measured_before),
                         MiB(measured_after), MiB(memory_limit_bytes),
                         fits ? "fits" : "does not fit (nothing left worth recomputing)");
  }
  return s;
}

absl::StatusOr<bool> RematPass::Run(ir::Graph& graph) {
  report_ = {};
  report_.memory_limit_bytes = options_.memory_limit_bytes;
  auto measure = [&](const ir::Graph& g) {
    return options_.measure ? options_.measure(g) : PeakLiveBytes(g, traits_);
  };
  absl::StatusOr<ir::Graph> scheduled =
      ReorderNodes(graph, MemorySchedule(graph, nullptr, traits_));
  if (!scheduled.ok()) return scheduled.status();
  ir::Graph g = std::move(*scheduled);
  report_.peak_before = PeakLiveBytes(g, traits_);
  const bool limited = options_.memory_limit_bytes > 0;
  report_.measured_before = limited ? measure(g) : report_.peak_before;

  auto apply = [&](const Candidate& c) -> absl::Status {
    KILN_ASSIGN_OR_RETURN(g, Apply(g, c));
    ++report_.recomputed;
    report_.added_nodes += static_cast<int>(c.chain.size());
    return absl::OkStatus();
  };
  // Policy: what frees more than it costs and does not raise the peak, best first.
  while (report_.recomputed < options_.max_recomputed) {
    Analysis a(g, options_, traits_);
    const Candidate* best = nullptr;
    std::vector<Candidate> cands = a.Candidates();
    for (const Candidate& c : cands)
      if (c.area_saved > 0 && c.new_peak <= a.peak() && (!best || c.area_saved > best->area_saved))
        best = &c;
    if (!best) break;
    KILN_RETURN_IF_ERROR(apply(*best));
  }
  // The copies sit just before their readers; the scheduler may find a better order around them
  // (it never raises the peak).
  auto reschedule = [&] {
    absl::StatusOr<ir::Graph> r = ReorderNodes(g, MemorySchedule(g, nullptr, traits_));
    if (r.ok()) g = std::move(*r);
  };
  if (report_.recomputed > 0) reschedule();
  // Memory limit: whatever lowers the peak most, until the graph fits.
  int64_t measured = limited ? measure(g) : 0;
  while (limited && measured > options_.memory_limit_bytes &&
         report_.recomputed < options_.max_recomputed) {
    Analysis a(g, options_, traits_);
    const Candidate* best = nullptr;
    std::vector<Candidate> cands = a.Candidates();
    for (const Candidate& c : cands)
      if (c.new_peak < a.peak() &&
          (!best || c.new_peak < best->new_peak ||
           (c.new_peak == best->new_peak && c.area_saved > best->area_saved)))
        best = &c;
    if (!best) break;
    KILN_RETURN_IF_ERROR(apply(*best));
    reschedule();
    measured = measure(g);
  }

  report_.peak_after = PeakLiveBytes(g, traits_);
  report_.measured_after = limited ? measured : report_.peak_after;
  report_.fits = !limited || report_.measured_after <= options_.memory_limit_bytes;
  bool better = report_.peak_after < report_.peak_before ||
                (limited && report_.measured_after < report_.measured_before);
  if (report_.recomputed == 0 || !better) {
    report_.recomputed = report_.added_nodes = 0;
    report_.peak_after = report_.peak_before;
    report_.measured_after = report_.measured_before;
    report_.fits = !limited || report_.measured_before <= options_.memory_limit_bytes;
    return false;
  }
  graph = std::move(g);
  return true;
}

}  // namespace kiln::compiler
