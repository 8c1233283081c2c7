// A static tensor shape: a list of non-negative dimension sizes. Rank 0 is a scalar.
//
//   Shape s{32, 128};
//   s.rank() == 2; s.num_elements() == 4096; s.ToString() == "[32,128]"
#ifndef KILN_TENSOR_SHAPE_H_
#define KILN_TENSOR_SHAPE_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace kiln {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t dim(int i) const { return dims_[i]; }
  int64_t operator[](int i) const { return dims_[i]; }
  const std::vector<int64_t>& dims() const { return dims_; }
  std::vector<int64_t>& mutable_dims() { return dims_; }
  int64_t num_elements() const {
    int64_t n = 1;
    for (int64_t d : dims_) n *= d;
    return n;
  }
  // Row-major strides in elements.
  std::vector<int64_t> Strides() const {
    std::vector<int64_t> s(dims_.size(), 1);
    for (int i = rank() - 2; i >= 0; --i) s[i] = s[i + 1] * dims_[i + 1];
    return s;
  }
  std::string ToString() const {
    std::string out = "[";
    for (size_t i = 0; i < dims_.size(); ++i) {
      if (i) out += ",";
      out += std::to_string(dims_[i]);
    }
    return out + "]";
  }
  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }

 private:
  std::vector<int64_t> dims_;
};

}  // namespace kiln

#endif  // KILN_TENSOR_SHAPE_H_
