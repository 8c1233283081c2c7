// Exported artifacts: an optimized program with its signature and weights, as a directory a
// process that never saw the model code can load and run (`kiln export` writes one; a server or
// `kiln run` loads it). Layout and manifest fields byte by byte in docs/formats.md
// ("Exported artifact"):
//
//   <dir>/manifest.json        format "kiln.artifact", version 1, signature, hashes
//   <dir>/program.ir           the optimized graph as IR text (docs/ir.md)
//   <dir>/weights.safetensors  the weights, by parameter name
//
// Writing (weights = the parameters bound at export time; the other parameters are the runtime
// inputs):
//
//   KILN_ASSIGN_OR_RETURN(ir::Graph program, CompileCache::Default().GetOrOptimize(g, opts, key));
//   ArtifactOptions ao;
//   ao.backend = key;
//   KILN_RETURN_IF_ERROR(WriteArtifact("/models/mlp", program, {{"w1", w1}, {"b1", b1}}, ao));
//
// Loading and running (the caller owns the backend: compiler sits above runtime):
//
//   KILN_ASSIGN_OR_RETURN(Artifact a, LoadArtifact("/models/mlp"));
//   KILN_ASSIGN_OR_RETURN(auto exe, backend->Compile(a.program));
//   KILN_ASSIGN_OR_RETURN(std::vector<Tensor> args, a.BindInputs({{"x", x}}));
//   KILN_ASSIGN_OR_RETURN(std::vector<Tensor> outs, exe->Run(args));   // a.signature.outputs order
//
// The buffer plan is not stored: it is a deterministic function of the program that the backend
// recomputes in Compile (cheap next to running), which keeps the artifact backend-portable.
#ifndef KILN_COMPILER_ARTIFACT_H_
#define KILN_COMPILER_ARTIFACT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "kiln/ir/graph.h"
#include "kiln/tensor/tensor.h"

namespace kiln::compiler {

inline constexpr char kArtifactFormat[] = "kiln.artifact";
inline constexpr int kArtifactVersion = 1;

struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  bool operator==(const TensorSpec& o) const {
    return name == o.name && dtype == o.dtype && shape == o.shape;
  }
};

struct InputSpec : TensorSpec {
  bool weight = false;  // bound from weights.safetensors, not supplied by the caller
};

struct ArtifactSignature {
  std::vector<InputSpec> inputs;    // every parameter, in parameter-index order
  std::vector<TensorSpec> outputs;  // in output order

  // The non-weight inputs, in order: what a caller supplies.
  std::vector<TensorSpec> RuntimeInputs() const;
};

// The signature a program implies, with `weight_names` marked as weights.
ArtifactSignature SignatureOf(const ir::Graph& program,
                              const std::vector<std::string>& weight_names);

struct ArtifactOptions {
  // What the program was optimized for (the compile-cache backend key), e.g. "cpu/avx512-bf16";
  // informational: any backend can run the program.
  std::string backend;
  // Replace an existing artifact at `dir` (else AlreadyExists).
  bool overwrite = false;
  // Free-form strings stored in the manifest ("model": "mlp", "step": "1000").
  std::map<std::string, std::string> metadata;
};

struct Artifact {
  ir::Graph program;
  std::map<std::string, Tensor> weights;
  ArtifactSignature signature;
  std::string compiler_version;  // of the exporting compiler
  std::string backend;
  std::string program_sha256;
  std::map<std::string, std::string> metadata;

  // Every parameter in index order: weights from `weights`, the rest from `inputs` by name.
  // InvalidArgument naming the input for a missing, unknown, or wrongly typed input.
  absl::StatusOr<std::vector<Tensor>> BindInputs(const std::map<std::string, Tensor>& inputs) const;
};

// Writes the artifact directory atomically (into a temporary sibling, then renamed). The program
// must verify; every weight must name a parameter and match its dtype and shape.
absl::Status WriteArtifact(const std::string& dir, const ir::Graph& program,
                           const std::map<std::string, Tensor>& weights,
                           const ArtifactOptions& options = {}, Env* env = nullptr);

// Reads and verifies an artifact: every file present, sizes and checksums as the manifest says,
// the format and version supported, the program parses and verifies, the signature matches the
// program, and every weight is present with its declared dtype and shape. Errors name the file
// and the problem (NotFound for a missing file, DataLoss for corruption, FailedPrecondition for an
// unsupported version, InvalidArgument for an inconsistent manifest).
absl::StatusOr<Artifact> LoadArtifact(const std::string& dir, Env* env = nullptr);

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_ARTIFACT_H_
