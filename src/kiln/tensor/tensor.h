// A host tensor: dtype, shape and 64-byte aligned, row-major storage.
//
//   Tensor t(DType::kF32, Shape{2, 3});           // zero-filled
//   t.data<float>()[0] = 1.0f;
//   Tensor u = Tensor::FromVector<float>(Shape{3}, {1, 2, 3});
//   Tensor v = t.Clone();                          // deep copy
//
// Copies of a Tensor share storage (like a pointer to a buffer); Clone() makes an independent copy.
#ifndef KILN_TENSOR_TENSOR_H_
#define KILN_TENSOR_TENSOR_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kiln/tensor/dtype.h"
#include "kiln/tensor/shape.h"

namespace kiln {

inline constexpr int64_t kTensorAlignment = 64;

class Tensor {
 public:
  Tensor() : Tensor(DType::kF32, Shape{0}) {}
  Tensor(DType dtype, Shape shape);  // zero-filled

  template <typename T>
  static Tensor FromVector(Shape shape, const std::vector<T>& values, DType dtype);
  // Float data converted to `dtype` (any floating type, or integers/bool by truncation).
  static Tensor FromDoubles(DType dtype, Shape shape, const std::vector<double>& values);
  template <typename T>
  static Tensor FromVector(Shape shape, const std::vector<T>& values);  // dtype from T

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t num_elements() const { return shape_.num_elements(); }
  int64_t byte_size() const { return num_elements() * DTypeSize(dtype_); }

  void* raw_data() { return data_.get(); }
  const void* raw_data() const { return data_.get(); }
  template <typename T>
  T* data() {
    return static_cast<T*>(raw_data());
  }
  template <typename T>
  const T* data() const {
    return static_cast<const T*>(raw_data());
  }

  // Element i as double / every element as double, whatever the dtype.
  double GetDouble(int64_t i) const { return LoadAsDouble(raw_data(), dtype_, i); }
  void SetDouble(int64_t i, double v) { StoreFromDouble(raw_data(), dtype_, i, v); }
  std::vector<double> ToDoubles() const;

  Tensor Clone() const;
  // Element-wise conversion (rounding as StoreFromDouble does).
  Tensor ConvertTo(DType dtype) const;
  // Same storage viewed with another shape of equal element count.
  Tensor Reshaped(Shape shape) const;
  // True when dtype, shape and bytes are all equal.
  bool BitwiseEquals(const Tensor& other) const;
  // "f32[2,3]"
  std::string TypeString() const;

 private:
  DType dtype_;
  Shape shape_;
  std::shared_ptr<uint8_t> data_;
};

template <typename T>
Tensor Tensor::FromVector(Shape shape, const std::vector<T>& values, DType dtype) {
  Tensor t(dtype, std::move(shape));
  for (size_t i = 0; i < values.size() && static_cast<int64_t>(i) < t.num_elements(); ++i)
    t.SetDouble(static_cast<int64_t>(i), static_cast<double>(values[i]));
  return t;
}

template <typename T>
Tensor Tensor::FromVector(Shape shape, const std::vector<T>& values) {
  DType dt;
  if constexpr (std::is_same_v<T, float>)
    dt = DType::kF32;
  else if constexpr (std::is_same_v<T, double>)
    dt = DType::kF64;
  else if constexpr (std::is_same_v<T, int32_t>)
    dt = DType::kS32;
  else if constexpr (std::is_same_v<T, int64_t>)
    dt = DType::kS64;
  else if constexpr (std::is_same_v<T, uint8_t>)
    dt = DType::kU8;
  else if constexpr (std::is_same_v<T, int8_t>)
    dt = DType::kS8;
  else if constexpr (std::is_same_v<T, bool>)
    dt = DType::kBool;
  else
    static_assert(sizeof(T) == 0, "unsupported element type");
  return FromVector<T>(std::move(shape), values, dt);
}

}  // namespace kiln

#endif  // KILN_TENSOR_TENSOR_H_
