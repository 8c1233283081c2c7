#include "kiln/dist/thread_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "kiln/base/mutex.h"
#include "kiln/base/status.h"
#include "kiln/dist/internal/reduce.h"

namespace kiln::dist {
namespace {

absl::string_view AV(std::string_view v) { return absl::string_view(v.data(), v.size()); }

using Clock = std::chrono::steady_clock;

enum class OpKind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier, kSplit };

const char* OpName(OpKind k) {
  switch (k) {
    case OpKind::kAllReduce:
      return "AllReduce";
    case OpKind::kReduceScatter:
      return "ReduceScatter";
    case OpKind::kAllGather:
      return "AllGather";
    case OpKind::kBroadcast:
      return "Broadcast";
    case OpKind::kBarrier:
      return "Barrier";
    case OpKind::kSplit:
      return "Split";
  }
  return "?";
}

// What one rank posts for a collective.
struct Post {
  OpKind kind = OpKind::kBarrier;
  const void* send = nullptr;  // the input (AllReduce, Broadcast: the data buffer)
  int64_t count = 0;  // AllReduce, Broadcast: elements; ReduceScatter: recv; AllGather: send
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  int color = 0, key = 0;  // Split
};

struct Group {
  explicit Group(int n) : size(n), posts(n) {}
  const int size;
  Mutex mu;
  std::condition_variable cv;
  int arrived ABSL_GUARDED_BY(mu) = 0;
  uint64_t generation ABSL_GUARDED_BY(mu) = 0;
  std::vector<Post> posts ABSL_GUARDED_BY(mu);
  bool broken ABSL_GUARDED_BY(mu) = false;
  std::string broken_reason ABSL_GUARDED_BY(mu);
  // Split: the groups being handed out, by (the generation of the Split call, color); the last
  // member to take its group removes the entry.
  struct Pending {
    std::shared_ptr<Group> group;
    int takers_left = 0;
  };
  std::map<std::pair<uint64_t, int>, Pending> splits ABSL_GUARDED_BY(mu);
};

// The first argument in which `p` differs from `q`, or "" when they agree.
std::string Mismatch(const Post& p, const Post& q) {
  if (p.kind != q.kind) return absl::StrCat("op ", OpName(p.kind), " vs ", OpName(q.kind));
  if (p.count != q.count) return absl::StrCat("element count ", p.count, " vs ", q.count);
  if (p.dtype != q.dtype)
    return absl::StrCat("dtype ", AV(DTypeName(p.dtype)), " vs ", AV(DTypeName(q.dtype)));
  if (p.kind == OpKind::kAllReduce || p.kind == OpKind::kReduceScatter) {
    if (p.op != q.op)
      return absl::StrCat("reduction ", AV(ReduceOpName(p.op)), " vs ", AV(ReduceOpName(q.op)));
  }
  if (p.kind == OpKind::kBroadcast && p.root != q.root)
    return absl::StrCat("root ", p.root, " vs ", q.root);
  return "";
}

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<Group> group, int rank)
      : Communicator(rank, group->size), group_(std::move(group)) {}

  bool broken() const override {
    MutexLock lock(group_->mu);
    return group_->broken;
  }

  void Abort(int code) override {
    MutexLock lock(group_->mu);
    if (!group_->broken) {
      group_->broken = true;
      group_->broken_reason = absl::StrCat("rank ", rank(), " aborted the job (code ", code, ")");
    }
    group_->cv.notify_all();
  }

 protected:
  absl::Status DoAllReduce(void* data, int64_t count, DType dtype, ReduceOp op) override {
    const int64_t bytes = count * DTypeSize(dtype);
    if (static_cast<int64_t>(scratch_.size()) < bytes) scratch_.resize(bytes);
    Post post{OpKind::kAllReduce, data, count, dtype, op, 0};
    return Run(
        post, bytes,
        [&](const std::vector<const void*>& in) {
          internal::ReduceRankOrder(in.data(), size(), 0, count, dtype, op, scratch_.data());
        },
        [&] { std::memcpy(data, scratch_.data(), bytes); });
  }

  absl::Status DoReduceScatter(const void* send, void* recv, int64_t recv_count, DType dtype,
                               ReduceOp op) override {
    Post post{OpKind::kReduceScatter, send, recv_count, dtype, op, 0};
    return Run(
        post, recv_count * size() * DTypeSize(dtype),
        [&](const std::vector<const void*>& in) {
          internal::ReduceRankOrder(in.data(), size(), rank() * recv_count, recv_count, dtype, op,
                                    recv);
        },
        [] {});
  }

  absl::Status DoAllGather(const void* send, void* recv, int64_t send_count, DType dtype) override {
    const int64_t bytes = send_count * DTypeSize(dtype);
    Post post{OpKind::kAllGather, send, send_count, dtype, ReduceOp::kSum, 0};
    return Run(
        post, bytes * size(),
        [&](const std::vector<const void*>& in) {
          for (int r = 0; r < size(); ++r)
            std::memcpy(static_cast<uint8_t*>(recv) + r * bytes, in[r], bytes);
        },
        [] {});
  }

  absl::Status DoBroadcast(void* data, int64_t count, DType dtype, int root) override {
    const int64_t bytes = count * DTypeSize(dtype);
    Post post{OpKind::kBroadcast, data, count, dtype, ReduceOp::kSum, root};
    return Run(
        post, bytes,
        [&](const std::vector<const void*>& in) {
          if (rank() != root) std::memcpy(data, in[root], bytes);
        },
        [] {});
  }

  absl::Status DoBarrier() override {
    Post post;
    return Run(
        post, 0, [](const std::vector<const void*>&) {}, [] {});
  }

  // Every rank posts its color and key; each then finds its group's members in the posts (the
  // same on every rank) and takes the group state shared by them, created by whichever member
  // comes first.
  absl::StatusOr<std::unique_ptr<Communicator>> DoSplit(int color, int key) override {
    Post post;
    post.kind = OpKind::kSplit;
    post.color = color;
    post.key = key;
    std::string bad;
    std::shared_ptr<Group> group;
    int new_rank = 0;
    KILN_RETURN_IF_ERROR(Run(
        post, 0,
        [&](const std::vector<const void*>&) {
          std::vector<std::pair<int, int>> members;  // (key, rank) of this rank's color
          for (int r = 0; r < size(); ++r) {
            const Post& p = seen_[r];
            if (p.color < 0 && bad.empty())
              bad = absl::StrCat("rank ", r, " passed color ", p.color, "; colors must be >= 0");
            if (p.color == color) members.emplace_back(p.key, r);
          }
          if (!bad.empty()) return;
          std::sort(members.begin(), members.end());
          for (size_t i = 0; i < members.size(); ++i)
            if (members[i].second == rank()) new_rank = static_cast<int>(i);
          MutexLock lock(group_->mu);
          // Between the two rendezvous of a call the generation is the same on every rank.
          auto [it, fresh] = group_->splits.try_emplace({group_->generation, color});
          if (fresh) {
            it->second.group = std::make_shared<Group>(static_cast<int>(members.size()));
            it->second.takers_left = static_cast<int>(members.size());
          }
          group = it->second.group;
          if (--it->second.takers_left == 0) group_->splits.erase(it);
        },
        [] {}));
    if (!bad.empty()) return absl::InvalidArgumentError(absl::StrCat("Split: ", bad));
    auto comm = std::make_unique<ThreadCommunicator>(std::move(group), new_rank);
    comm->set_timeout(timeout());
    return comm;
  }

 private:
  // Posts `post`, waits for every rank, checks the posts agree, runs `read` on every rank's input
  // buffer, waits until every rank has read, then runs `write` (which touches only this rank's
  // buffers).
  template <typename Read, typename Write>
  absl::Status Run(const Post& post, int64_t bytes, Read read, Write write) {
    const auto deadline = Clock::now() + timeout();
    const char* op = OpName(post.kind);
    std::vector<const void*> in(size());
    std::string mismatch;
    {
      UniqueLock lock(group_->mu);
      group_->posts[rank()] = post;
      KILN_RETURN_IF_ERROR(Rendezvous(lock.get(), deadline, op, bytes));
      seen_ = group_->posts;
      for (int r = 0; r < size(); ++r) {
        in[r] = group_->posts[r].send;
        if (mismatch.empty() && r != rank()) {
          std::string m = Mismatch(group_->posts[rank()], group_->posts[r]);
          if (!m.empty()) mismatch = absl::StrCat("rank ", rank(), " vs rank ", r, ": ", m);
        }
      }
    }
    if (mismatch.empty()) read(in);
    {
      // No deadline: every rank has arrived, and what is left before this rendezvous is local work
      // (a bounded copy or reduction). Waiting for it keeps this rank's buffers alive while a peer
      // reads them.
      UniqueLock lock(group_->mu);
      KILN_RETURN_IF_ERROR(Rendezvous(lock.get(), Clock::time_point::max(), op, bytes));
    }
    if (!mismatch.empty())
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": the ranks passed different arguments: ", mismatch));
    write();
    return absl::OkStatus();
  }

  // Waits, holding `lock`, until all ranks have arrived; breaks the group at the deadline.
  // (The broken flag is checked first: a group broken between the two rendezvous of a call ends
  // the wait.)
  absl::Status Rendezvous(std::unique_lock<std::mutex>& lock, Clock::time_point deadline,
                          const char* op, int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(group_->mu) {
    Group& g = *group_;
    g.mu.AssertHeld();  // the same mutex, by its alias
    if (g.broken)
      return absl::FailedPreconditionError(absl::StrCat(
          op, " on rank ", rank(), ": the communicator group is broken (", g.broken_reason, ")"));
    const uint64_t generation = g.generation;
    if (++g.arrived == g.size) {
      g.arrived = 0;
      ++g.generation;
      g.cv.notify_all();
      return absl::OkStatus();
    }
    while (g.generation == generation) {
      if (g.broken)
        return CollectiveTimeout(op, bytes, rank(), size(), timeout(),
                                 absl::StrCat(": ", g.broken_reason));
      if (deadline == Clock::time_point::max()) {
        g.cv.wait(lock);
        continue;
      }
      if (g.cv.wait_until(lock, deadline) == std::cv_status::timeout &&
          g.generation == generation && !g.broken) {
        g.broken = true;
        g.broken_reason =
            absl::StrCat("rank ", rank(), " waited ", timeout().count(), " ms in ", op, "; ",
                         g.size - g.arrived, " of ", g.size, " ranks never arrived");
        g.cv.notify_all();
        return CollectiveTimeout(
            op, bytes, rank(), size(), timeout(),
            absl::StrCat(": ", g.size - g.arrived, " of ", g.size, " ranks never arrived"));
      }
    }
    return absl::OkStatus();
  }

  std::shared_ptr<Group> group_;
  std::vector<uint8_t> scratch_;
  std::vector<Post> seen_;  // every rank's post of the current call (read between rendezvous)
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> MakeThreadCommunicators(
    int n, std::chrono::milliseconds timeout) {
  auto group = std::make_shared<Group>(n);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r) {
    comms.push_back(std::make_unique<ThreadCommunicator>(group, r));
    comms.back()->set_timeout(timeout);
  }
  return comms;
}

}  // namespace kiln::dist
