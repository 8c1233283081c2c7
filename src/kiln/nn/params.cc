#include "kiln/nn/params.h"

#include <cmath>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/base/hash.h"

namespace kiln::nn {

Initializer Initializer::KaimingUniform(int64_t fan_in, double a) {
  const double gain = std::sqrt(2.0 / (1.0 + a * a));
  return Uniform(gain * std::sqrt(3.0 / static_cast<double>(fan_in > 0 ? fan_in : 1)));
}

absl::Status ParamStore::Add(const std::string& name, Tensor value) {
  if (Contains(name)) {
    return absl::AlreadyExistsError(absl::StrCat("parameter '", name, "' already exists"));
  }
  index_[name] = size();
  names_.push_back(name);
  values_.push_back(std::move(value));
  return absl::OkStatus();
}

const Tensor* ParamStore::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &values_[it->second];
}

Tensor* ParamStore::Find(const std::string& name) {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &values_[it->second];
}

absl::StatusOr<Tensor> ParamStore::Get(const std::string& name) const {
  const Tensor* t = Find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no parameter '", name, "'"));
  return *t;
}

int64_t ParamStore::num_elements() const {
  int64_t n = 0;
  for (const Tensor& t : values_) n += t.num_elements();
  return n;
}

ParamStore ParamStore::Clone() const {
  ParamStore out;
  out.names_ = names_;
  out.index_ = index_;
  out.values_.reserve(values_.size());
  for (const Tensor& t : values_) out.values_.push_back(t.Clone());
  return out;
}

absl::StatusOr<ParamStore> InitParams(const std::vector<ParamSpec>& specs, uint64_t seed) {
  ParamStore store;
  for (const ParamSpec& spec : specs) {
    Tensor t(spec.dtype, spec.shape);
    const Initializer::Kind kind = spec.init.kind;
    if (kind == Initializer::Kind::kUniform || kind == Initializer::Kind::kNormal) {
      const char* what = kind == Initializer::Kind::kUniform ? "uniform" : "normal";
      if (!IsFloating(spec.dtype)) {
        return absl::InvalidArgumentError(absl::StrCat("parameter '", spec.name, "' has dtype ",
                                                       std::string(DTypeName(spec.dtype)), ": a ",
                                                       what, " initializer needs a float"));
      }
      if (!(spec.init.bound >= 0.0)) {
        return absl::InvalidArgumentError(absl::StrCat("parameter '", spec.name, "': ", what,
                                                       " bound / stddev must be >= 0, got ",
                                                       spec.init.bound));
      }
      std::mt19937_64 rng(SplitMix64(seed ^ Fnv1a64(spec.name)));
      // 53 random bits -> [0, 1); the same on every platform.
      auto next_unit = [&rng] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };
      const double b = spec.init.bound;
      if (kind == Initializer::Kind::kUniform) {
        for (int64_t i = 0; i < t.num_elements(); ++i)
          t.SetDouble(i, b * (2.0 * next_unit() - 1.0));
      } else {
        // Box-Muller: two uniforms give two independent standard normals.
        constexpr double kTwoPi = 6.283185307179586476925286766559;
        for (int64_t i = 0; i < t.num_elements(); i += 2) {
          const double u1 = 1.0 - next_unit();  // (0, 1]: log is finite
          const double u2 = next_unit();
          const double r = std::sqrt(-2.0 * std::log(u1));
          t.SetDouble(i, b * r * std::cos(kTwoPi * u2));
          if (i + 1 < t.num_elements()) t.SetDouble(i + 1, b * r * std::sin(kTwoPi * u2));
        }
      }
    } else if (kind == Initializer::Kind::kConstant) {
      for (int64_t i = 0; i < t.num_elements(); ++i) t.SetDouble(i, spec.init.bound);
    }
    absl::Status s = store.Add(spec.name, std::move(t));
    if (!s.ok()) return absl::InvalidArgumentError(std::string(s.message()));
  }
  return store;
}

absl::StatusOr<ParamStore> ZerosLike(const std::vector<ParamSpec>& specs) {
  ParamStore store;
  for (const ParamSpec& spec : specs) {
    absl::Status s = store.Add(spec.name, Tensor(spec.dtype, spec.shape));
    if (!s.ok()) return absl::InvalidArgumentError(std::string(s.message()));
  }
  return store;
}

std::string JoinName(const std::string& scope, const std::string& leaf, char sep) {
  if (scope.empty()) return leaf;
  std::string out = scope;
  out += sep;
  out += leaf;
  return out;
}

ParamValues AddParameters(ir::Builder& b, const std::vector<ParamSpec>& specs) {
  ParamValues values;
  for (const ParamSpec& spec : specs)
    values[spec.name] = b.Parameter(spec.name, spec.dtype, spec.shape);
  return values;
}

ir::Value Lookup(ir::Builder& b, const ParamValues& params, const std::string& name) {
  auto it = params.find(name);
  if (it == params.end()) {
    b.SetError(absl::NotFoundError(
        absl::StrCat("model parameter '", name, "' was not added to the graph")));
    return ir::Value();
  }
  return it->second;
}

}  // namespace kiln::nn
