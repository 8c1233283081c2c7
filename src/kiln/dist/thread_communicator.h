// In-process communicators: n ranks that are threads of one process, sharing one group state.
// For unit tests and single-host tests of code built on the Communicator seam; always built.
//
//   std::vector<std::unique_ptr<Communicator>> comms = MakeThreadCommunicators(4);
//   std::vector<std::thread> threads;
//   for (int r = 0; r < 4; ++r)
//     threads.emplace_back([&, r] { KILN_CHECK_OK(comms[r]->AllReduce(t[r], ReduceOp::kSum)); });
//
// Each collective is two rendezvous: every rank posts its buffers and arguments and waits for the
// others; each then reads the others' buffers and writes only its own (AllReduce computes into a
// private scratch first, as its buffer is also an input), and a second rendezvous keeps every
// buffer alive and unchanged until all ranks are done reading. Reductions run in rank order (see
// communicator.h), so results do not depend on thread timing. Arguments are compared across ranks
// at the first rendezvous: a mismatch (op, count, dtype, reduction, root) fails the call on every
// rank with InvalidArgument. A rank that does not arrive within the timeout breaks the group: the
// waiting ranks get DeadlineExceeded, every later call FailedPrecondition.
// Split posts each rank's color and key the same way; each group it returns shares a new group
// state (its own rendezvous, timeout and broken flag) among its members.
#ifndef KILN_DIST_THREAD_COMMUNICATOR_H_
#define KILN_DIST_THREAD_COMMUNICATOR_H_

#include <chrono>
#include <memory>
#include <vector>

#include "kiln/dist/communicator.h"

namespace kiln::dist {

// n >= 1 communicators, rank r at index r; each is used by one thread. The group state lives as
// long as any of them.
std::vector<std::unique_ptr<Communicator>> MakeThreadCommunicators(
    int n, std::chrono::milliseconds timeout = kDefaultCollectiveTimeout);

}  // namespace kiln::dist

#endif  // KILN_DIST_THREAD_COMMUNICATOR_H_
