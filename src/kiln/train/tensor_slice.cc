#include "kiln/train/tensor_slice.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln::train {

TensorSlice TensorSlice::Box(std::vector<int64_t> offsets, std::vector<int64_t> sizes) {
  TensorSlice s;
  s.offsets = std::move(offsets);
  s.sizes = std::move(sizes);
  return s;
}

TensorSlice TensorSlice::Flat(int64_t begin, int64_t end) {
  TensorSlice s;
  s.flat = true;
  s.begin = begin;
  s.end = end;
  return s;
}

TensorSlice TensorSlice::Whole(const Shape& shape) {
  return Box(std::vector<int64_t>(shape.rank(), 0), shape.dims());
}

int64_t TensorSlice::num_elements() const {
  if (flat) return end - begin;
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

Shape TensorSlice::PieceShape() const { return flat ? Shape{end - begin} : Shape(sizes); }

absl::Status TensorSlice::Check(const Shape& whole) const {
  if (flat) {
    if (begin < 0 || end < begin || end > whole.num_elements()) {
      return absl::InvalidArgumentError(absl::StrCat("slice ", ToString(), " is not inside ",
                                                     whole.num_elements(), " elements (shape ",
                                                     whole.ToString(), ")"));
    }
    return absl::OkStatus();
  }
  if (static_cast<int>(offsets.size()) != whole.rank() ||
      static_cast<int>(sizes.size()) != whole.rank()) {
    return absl::InvalidArgumentError(
        absl::StrCat("slice ", ToString(), " has ", offsets.size(), " offsets and ", sizes.size(),
                     " sizes for a tensor of shape ", whole.ToString()));
  }
  for (int d = 0; d < whole.rank(); ++d) {
    if (offsets[d] < 0 || sizes[d] < 0 || offsets[d] + sizes[d] > whole.dim(d)) {
      return absl::InvalidArgumentError(absl::StrCat("slice ", ToString(), " is not inside shape ",
                                                     whole.ToString(), " (dimension ", d, ")"));
    }
  }
  return absl::OkStatus();
}

std::string TensorSlice::ToString() const {
  if (flat) return absl::StrCat("flat[", begin, ":", end, "]");
  std::vector<std::string> dims;
  for (size_t d = 0; d < offsets.size() && d < sizes.size(); ++d) {
    dims.push_back(absl::StrCat(offsets[d], ":", offsets[d] + sizes[d]));
  }
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

std::vector<SliceRun> SliceRuns(const TensorSlice& slice, const Shape& whole) {
  std::vector<SliceRun> runs;
  if (slice.num_elements() == 0) return runs;
  if (slice.flat) {
    runs.push_back({slice.begin, slice.end - slice.begin, 0});
    return runs;
  }
  const int rank = whole.rank();
  if (rank == 0) {
    runs.push_back({0, 1, 0});
    return runs;
  }
  // Row-major strides of the whole tensor; one run per index of the box's leading dimensions.
  std::vector<int64_t> stride(rank, 1);
  for (int d = rank - 2; d >= 0; --d) stride[d] = stride[d + 1] * whole.dim(d + 1);
  const int64_t row = slice.sizes[rank - 1];
  std::vector<int64_t> idx(rank, 0);
  int64_t local = 0;
  while (true) {
    int64_t start = slice.offsets[rank - 1];
    for (int d = 0; d + 1 < rank; ++d) start += (slice.offsets[d] + idx[d]) * stride[d];
    // Consecutive rows that touch (the box spans whole trailing dimensions) merge into one run.
    if (!runs.empty() && runs.back().start + runs.back().length == start) {
      runs.back().length += row;
    } else {
      runs.push_back({start, row, local});
    }
    local += row;
    int d = rank - 2;
    for (; d >= 0; --d) {
      if (++idx[d] < slice.sizes[d]) break;
      idx[d] = 0;
    }
    if (d < 0) break;
  }
  return runs;
}

int64_t CopyOverlap(const std::vector<SliceRun>& src_runs, const void* src,
                    const std::vector<SliceRun>& dst_runs, void* dst, int64_t element_bytes) {
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  int64_t copied = 0;
  size_t i = 0, j = 0;
  while (i < src_runs.size() && j < dst_runs.size()) {
    const SliceRun& a = src_runs[i];
    const SliceRun& b = dst_runs[j];
    const int64_t lo = std::max(a.start, b.start);
    const int64_t hi = std::min(a.start + a.length, b.start + b.length);
    if (lo < hi) {
      std::memcpy(d + (b.local + lo - b.start) * element_bytes,
                  s + (a.local + lo - a.start) * element_bytes,
                  static_cast<size_t>((hi - lo) * element_bytes));
      copied += hi - lo;
    }
    if (a.start + a.length <= b.start + b.length) {
      ++i;
    } else {
      ++j;
    }
  }
  return copied;
}

}  // namespace kiln::train
