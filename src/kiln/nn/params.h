// Model parameters: what a layer declares (ParamSpec: name, type, initializer), the host values
// (ParamStore: name -> Tensor, in declaration order), seeded initialization, and the graph
// parameters standing for them while a model is being built.
//
//   Linear fc("fc0", 64, 10);
//   std::vector<ParamSpec> specs = fc.Params();             // fc0/weight f32[64,10], fc0/bias
//   KILN_ASSIGN_OR_RETURN(ParamStore store, InitParams(specs, /*seed=*/0));
//
//   ir::Builder b("logits");
//   ParamValues p = AddParameters(b, specs);                // graph parameters 0 and 1
//   ir::Value y = fc.Apply(p, b.Parameter("x", DType::kF32, {32, 64}));
//
// Initialization is deterministic: parameter `name` draws from std::mt19937_64 seeded with
// SplitMix64(seed ^ FNV-1a(name)), so a parameter's values depend on the seed and its own name
// only, not on how many parameters came before it. Uniform draws are bit-identical on every
// platform; normal draws use Box-Muller over the same stream (std::log/cos/sin, so a libm that
// rounds differently in the last place could differ there).
#ifndef KILN_NN_PARAMS_H_
#define KILN_NN_PARAMS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/ir/builder.h"
#include "kiln/tensor/tensor.h"

namespace kiln::nn {

// How a parameter's initial values are drawn.
struct Initializer {
  enum class Kind { kZeros, kUniform, kNormal, kConstant };
  Kind kind = Kind::kZeros;
  double bound = 0.0;  // kUniform: values in [-bound, bound); kNormal: the standard deviation;
                       // kConstant: the value

  static Initializer Zeros() { return {Kind::kZeros, 0.0}; }
  static Initializer Uniform(double bound) { return {Kind::kUniform, bound}; }
  // Normal with mean 0 and standard deviation `stddev` (torch.nn.init.normal_).
  static Initializer Normal(double stddev) { return {Kind::kNormal, stddev}; }
  static Initializer Constant(double value) { return {Kind::kConstant, value}; }
  static Initializer Ones() { return Constant(1.0); }
  // torch.nn.init.kaiming_uniform_(w, a): bound = gain * sqrt(3 / fan_in), gain = sqrt(2 / (1 +
  // a^2)). torch.nn.Linear uses a = sqrt(5), i.e. bound = 1 / sqrt(fan_in).
  static Initializer KaimingUniform(int64_t fan_in, double a);
};

struct ParamSpec {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  Initializer init;
};

// Host values of named parameters, kept in insertion order (the order graphs take them in).
class ParamStore {
 public:
  // AlreadyExists if `name` is taken.
  absl::Status Add(const std::string& name, Tensor value);
  bool Contains(const std::string& name) const { return index_.count(name) > 0; }
  // nullptr if absent.
  const Tensor* Find(const std::string& name) const;
  Tensor* Find(const std::string& name);
  // NotFound naming the parameter if absent.
  absl::StatusOr<Tensor> Get(const std::string& name) const;

  const std::vector<std::string>& names() const { return names_; }
  const Tensor& value(int i) const { return values_[i]; }
  Tensor& value(int i) { return values_[i]; }
  int size() const { return static_cast<int>(names_.size()); }
  int64_t num_elements() const;  // total scalars over all parameters
  // A deep copy (no storage shared with this store).
  ParamStore Clone() const;

 private:
  std::vector<std::string> names_;
  std::vector<Tensor> values_;
  std::map<std::string, int> index_;
};

// Draws every spec's initial value. InvalidArgument on duplicate names, a non-floating dtype with
// a uniform or normal initializer, or a negative bound / standard deviation.
absl::StatusOr<ParamStore> InitParams(const std::vector<ParamSpec>& specs, uint64_t seed);

// Zero-filled values for `specs` (whatever their initializers), e.g. optimizer state.
absl::StatusOr<ParamStore> ZerosLike(const std::vector<ParamSpec>& specs);

// Joins a scope and a leaf name: JoinName("blocks/0", "ln_1") is "blocks/0/ln_1", and with
// sep '.' "transformer.h.0" + "ln_1" is "transformer.h.0.ln_1". An empty scope gives the leaf.
std::string JoinName(const std::string& scope, const std::string& leaf, char sep = '/');

// The graph values standing for parameters, by name.
using ParamValues = std::map<std::string, ir::Value>;

// Adds one builder parameter per spec, in order, named as the spec.
ParamValues AddParameters(ir::Builder& b, const std::vector<ParamSpec>& specs);

// The value called `name`; when absent, records NotFound in `b` (the builder's error model) and
// returns an invalid Value: check valid() and return early.
ir::Value Lookup(ir::Builder& b, const ParamValues& params, const std::string& name);

}  // namespace kiln::nn

#endif  // KILN_NN_PARAMS_H_
