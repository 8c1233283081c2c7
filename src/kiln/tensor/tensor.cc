#include "kiln/tensor/tensor.h"

#include <cstdlib>
#include <new>

namespace kiln {
namespace {

std::shared_ptr<uint8_t> AllocateAligned(int64_t bytes) {
  size_t n = static_cast<size_t>(bytes);
  n = (n + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
  if (n == 0) n = kTensorAlignment;
  void* p = std::aligned_alloc(kTensorAlignment, n);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, n);
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { std::free(q); });
}

}  // namespace

Tensor::Tensor(DType dtype, Shape shape)
    : dtype_(dtype), shape_(std::move(shape)), data_(AllocateAligned(byte_size())) {}

Tensor Tensor::FromDoubles(DType dtype, Shape shape, const std::vector<double>& values) {
  return FromVector<double>(std::move(shape), values, dtype);
}

std::vector<double> Tensor::ToDoubles() const {
  std::vector<double> out(static_cast<size_t>(num_elements()));
  for (int64_t i = 0; i < num_elements(); ++i) out[i] = GetDouble(i);
  return out;
}

Tensor Tensor::Clone() const {
  Tensor t(dtype_, shape_);
  std::memcpy(t.raw_data(), raw_data(), static_cast<size_t>(byte_size()));
  return t;
}

Tensor Tensor::ConvertTo(DType dtype) const {
  Tensor t(dtype, shape_);
  for (int64_t i = 0; i < num_elements(); ++i) t.SetDouble(i, GetDouble(i));
  return t;
}

Tensor Tensor::Reshaped(Shape shape) const {
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

bool Tensor::BitwiseEquals(const Tensor& other) const {
  return dtype_ == other.dtype_ && shape_ == other.shape_ &&
         std::memcmp(raw_data(), other.raw_data(), static_cast<size_t>(byte_size())) == 0;
}

std::string Tensor::TypeString() const {
  return std::string(DTypeName(dtype_)) + shape_.ToString();
}

}  // namespace kiln
