// The reference backend: every op in opcodes.def, composites included, run by the reference
// kernels (kernels.h: plain loops that compute in double, exact int64 for integer ops, and round
// once to the output dtype). It is slow on purpose and simple enough to check by eye: it is the
// oracle the cpu backend, the decomposition pass and the PyTorch goldens are tested against, and
// the constant folder evaluates through the same kernels.
//
//   std::unique_ptr<Backend> ref = MakeReferenceBackend();
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<Executable> exe, ref->Compile(graph));
//   KILN_ASSIGN_OR_RETURN(std::vector<Tensor> outs, exe->Run({x}));
//
// Compile verifies the graph, then makes one thunk per non-source node, named "<op> %<id>".
// Unsupported dtypes (f8 outside data movement and convert, integers in transcendental ops) are
// InvalidArgument at compile time; collectives run through the run's (Shard)Collectives.
#ifndef KILN_RUNTIME_REFERENCE_REFERENCE_BACKEND_H_
#define KILN_RUNTIME_REFERENCE_REFERENCE_BACKEND_H_

#include <memory>

#include "kiln/runtime/executable.h"

namespace kiln::runtime {

std::unique_ptr<Backend> MakeReferenceBackend();

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_REFERENCE_REFERENCE_BACKEND_H_
