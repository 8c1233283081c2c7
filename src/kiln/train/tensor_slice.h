// Where a piece of a tensor lies in the whole tensor: the one description that sharded
// checkpoints (checkpoint.h, docs/formats.md "Sharded checkpoints"), ZeRO-1's flat shards
// (nn/train_step.h) and tensor-parallel parameter slices share.
//
//   TensorSlice box = TensorSlice::Box({0, 64}, {128, 64});   // rows 0..127, columns 64..127
//   TensorSlice flat = TensorSlice::Flat(1000, 2000);         // elements 1000..1999, row-major
//   KILN_RETURN_IF_ERROR(box.Check(Shape{128, 256}));
//
// A box holds its elements in row-major order of its own sizes; a flat range holds elements
// [begin, end) of the row-major flattening of the whole tensor. Either is a list of contiguous
// runs of the flattened tensor (Runs), which is how pieces of either kind are intersected.
#ifndef KILN_TRAIN_TENSOR_SLICE_H_
#define KILN_TRAIN_TENSOR_SLICE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kiln/tensor/shape.h"

namespace kiln::train {

struct TensorSlice {
  bool flat = false;
  std::vector<int64_t> offsets, sizes;  // a box: one of each per dimension of the whole tensor
  int64_t begin = 0, end = 0;           // a flat range

  static TensorSlice Box(std::vector<int64_t> offsets, std::vector<int64_t> sizes);
  static TensorSlice Flat(int64_t begin, int64_t end);
  static TensorSlice Whole(const Shape& shape);  // the box of the whole tensor

  int64_t num_elements() const;
  // The piece's own shape: `sizes` for a box, [end - begin] for a flat range.
  Shape PieceShape() const;
  // InvalidArgument unless the slice lies inside a tensor of `whole` shape (a box of its rank).
  absl::Status Check(const Shape& whole) const;
  bool operator==(const TensorSlice& o) const {
    return flat == o.flat && offsets == o.offsets && sizes == o.sizes && begin == o.begin &&
           end == o.end;
  }
  std::string ToString() const;  // "[0:128, 64:128]" or "flat[1000:2000]"
};

// A contiguous run of the flattened whole tensor: elements [start, start + length), which sit at
// element `local` of the piece's own buffer.
struct SliceRun {
  int64_t start = 0, length = 0, local = 0;
};
// The runs of `slice` (checked against `whole`), ascending by start; none for an empty slice.
std::vector<SliceRun> SliceRuns(const TensorSlice& slice, const Shape& whole);

// Copies the elements `src` (a piece laid out as `src_runs`) has in common with `dst` (laid out
// as `dst_runs`); returns how many were copied. Both run lists ascending (SliceRuns).
int64_t CopyOverlap(const std::vector<SliceRun>& src_runs, const void* src,
                    const std::vector<SliceRun>& dst_runs, void* dst, int64_t element_bytes);

}  // namespace kiln::train

#endif  // KILN_TRAIN_TENSOR_SLICE_H_
