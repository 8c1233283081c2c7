#include "kiln/train/mesh.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kiln::train {

absl::StatusOr<Mesh> ResolveMesh(const MeshConfig& config, int ranks, int64_t batch_size) {
  if (ranks < 1) return absl::InvalidArgumentError(absl::StrCat("mesh: ", ranks, " ranks"));
  if (config.model < 1 || config.data < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("mesh: data must be >= 0 and model >= 1, got {data: ", config.data,
                     ", model: ", config.model, "}"));
  }
  Mesh m;
  m.ranks = ranks;
  m.model = static_cast<int>(config.model);
  m.data = config.data > 0 ? static_cast<int>(config.data) : ranks / m.model;
  if (static_cast<int64_t>(m.data) * m.model != ranks || m.data < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mesh: data (",
        config.data > 0 ? absl::StrCat(config.data) : absl::StrCat("default ", m.data),
        ") x model (", m.model, ") must equal the number of ranks (", ranks, "): set --workers ",
        static_cast<int64_t>(std::max(m.data, 1)) * m.model, " or change mesh.data / mesh.model"));
  }
  if (batch_size % m.data != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.batch_size (", batch_size, ") must be divisible by mesh.data (", m.data,
        "): it is the global batch, and each data-parallel rank trains on batch_size / mesh.data "
        "of its examples"));
  }
  return m;
}

MeshCoords CoordsOf(const Mesh& mesh, int rank) {
  return MeshCoords{rank / mesh.model, rank % mesh.model};
}

absl::Status SliceBatch(const Tensor& global, int index, int parts, Tensor& local) {
  const Shape& g = global.shape();
  if (g.rank() < 1 || parts < 1 || index < 0 || index >= parts || g.dim(0) % parts != 0) {
    return absl::InvalidArgumentError(absl::StrCat("SliceBatch: cannot take part ", index, " of ",
                                                   parts, " of a ", global.TypeString(), " batch"));
  }
  const int64_t rows = g.dim(0) / parts;
  std::vector<int64_t> want = g.dims();
  want[0] = rows;
  if (local.dtype() != global.dtype() || local.shape() != Shape(want)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SliceBatch: the local batch is ", local.TypeString(), ", expected ",
                     Tensor(global.dtype(), Shape(want)).TypeString()));
  }
  const int64_t bytes = local.byte_size();
  if (bytes > 0) {
    std::memcpy(local.raw_data(), static_cast<const uint8_t*>(global.raw_data()) + index * bytes,
                bytes);
  }
  return absl::OkStatus();
}

std::vector<TensorParallelBox> TensorParallelBoxes(const ir::Sharding& sharding, const Shape& local,
                                                   int model, int model_rank, Shape* whole) {
  std::vector<int64_t> dims = local.dims();
  const int d = sharding.split_dim();
  if (d < 0 || d >= static_cast<int>(dims.size())) {
    *whole = local;
    return {{TensorSlice::Whole(local), TensorSlice::Whole(local)}};
  }
  const int64_t groups = std::max<int64_t>(1, sharding.dims[d].groups);
  const int64_t block = dims[d] / groups;  // of one group, on one rank
  dims[d] *= model;
  *whole = Shape(dims);
  std::vector<TensorParallelBox> boxes;
  for (int64_t q = 0; q < groups; ++q) {
    TensorParallelBox b{TensorSlice::Whole(*whole), TensorSlice::Whole(local)};
    b.global.offsets[d] = q * block * model + model_rank * block;
    b.global.sizes[d] = block;
    b.local.offsets[d] = q * block;
    b.local.sizes[d] = block;
    boxes.push_back(std::move(b));
  }
  return boxes;
}

}  // namespace kiln::train
