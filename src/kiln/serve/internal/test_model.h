// Test helper: a small MLP artifact (x f32[2,4] -> logits f32[2,3], prediction s32[2]) written
// with WriteArtifact, with seeded weights, for the serve tests.
#ifndef KILN_SERVE_INTERNAL_TEST_MODEL_H_
#define KILN_SERVE_INTERNAL_TEST_MODEL_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "kiln/base/status.h"
#include "kiln/compiler/artifact.h"
#include "kiln/ir/parser.h"

namespace kiln::serve::testing {

inline constexpr char kTestMlp[] = R"(graph @mlp_predict {
  %0 = parameter() {index=0, name="w1"} : f32[4,8]
  %1 = parameter() {index=1, name="b1"} : f32[8]
  %2 = parameter() {index=2, name="w2"} : f32[8,3]
  %3 = parameter() {index=3, name="b2"} : f32[3]
  %4 = parameter() {index=4, name="x"} : f32[2,4]
  %5 = dot_general(%4, %0) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]} : f32[2,8]
  %6 = broadcast_in_dim(%1) {broadcast_dimensions=[1], shape=[2,8]} : f32[2,8]
  %7 = add(%5, %6) : f32[2,8]
  %8 = relu(%7) : f32[2,8]
  %9 = dot_general(%8, %2) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]} : f32[2,3]
  %10 = broadcast_in_dim(%3) {broadcast_dimensions=[1], shape=[2,3]} : f32[2,3]
  %11 = add(%9, %10) : f32[2,3]
  %12 = argmax(%11) {axis=1} : s32[2]
  return logits=%11, prediction=%12
}
)";

inline Tensor SeededTensor(Shape shape, int seed) {
  Tensor t(DType::kF32, std::move(shape));
  for (int64_t i = 0; i < t.num_elements(); ++i)
    t.SetDouble(i, ((i * 7919 + seed * 104729) % 2001) / 1000.0 - 1.0);
  return t;
}

// Writes the MLP (or `program_text`, whose weights must be w1 b1 w2 b2) to `dir`, with
// `metadata` in its manifest.
inline absl::Status WriteTestMlp(const std::string& dir, const char* program_text = kTestMlp,
                                 const std::map<std::string, std::string>& metadata = {}) {
  KILN_ASSIGN_OR_RETURN(ir::Graph g, ir::ParseGraph(program_text));
  std::map<std::string, Tensor> w = {{"w1", SeededTensor(Shape{4, 8}, 1)},
                                     {"b1", SeededTensor(Shape{8}, 2)},
                                     {"w2", SeededTensor(Shape{8, 3}, 3)},
                                     {"b2", SeededTensor(Shape{3}, 4)}};
  compiler::ArtifactOptions o;
  o.overwrite = true;
  o.metadata = metadata;
  return compiler::WriteArtifact(dir, g, w, o);
}

}  // namespace kiln::serve::testing

#endif  // KILN_SERVE_INTERNAL_TEST_MODEL_H_
