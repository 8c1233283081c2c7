// The slice a multi-process `kiln train` runs on, as a mesh with named axes (docs/distributed.md):
// `mesh: {data: D, model: M}` over N = D x M ranks, rank r at data coordinate r / M and model
// coordinate r % M. Data parallel: data.batch_size B stays the GLOBAL batch; data rank d trains
// on rows [d B/D, (d+1) B/D) of every global batch, exactly the examples a one-process run puts
// in that batch, so adding workers never changes what is trained.
//
//   KILN_ASSIGN_OR_RETURN(Mesh mesh, ResolveMesh(config.mesh, comm->size(),
//   config.data.batch_size)); MeshCoords me = CoordsOf(mesh, comm->rank());
//   KILN_RETURN_IF_ERROR(SliceBatch(global_x, me.data, mesh.data, local_x));
#ifndef KILN_TRAIN_MESH_H_
#define KILN_TRAIN_MESH_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/ir/sharding.h"
#include "kiln/tensor/tensor.h"
#include "kiln/train/config.h"
#include "kiln/train/tensor_slice.h"

namespace kiln::train {

struct Mesh {
  int ranks = 1;
  int data = 1;
  int model = 1;
};

struct MeshCoords {
  int data = 0;
  int model = 0;
};

// The mesh of `config` over `ranks` processes: data 0 means ranks / model. InvalidArgument when
// data x model != ranks (naming both) or when batch_size is not divisible by data. model > 1 is
// tensor parallel (the Trainer refuses models without tensor-parallel layouts).
absl::StatusOr<Mesh> ResolveMesh(const MeshConfig& config, int ranks, int64_t batch_size);

MeshCoords CoordsOf(const Mesh& mesh, int rank);

// local = rows [index * n, (index + 1) * n) of `global` along dimension 0, n = global rows /
// parts; `local` must have n rows and the same dtype and row shape (InvalidArgument otherwise).
absl::Status SliceBatch(const Tensor& global, int index, int parts, Tensor& local);

// Tensor parallel: where the shard of a tensor that the rank at model coordinate `model_rank` of
// `model` holds lies in the whole tensor. `local` is the shard's shape under `sharding`
// (ir/sharding.h); `whole` receives the whole tensor's. One box per group of the split dimension
// (a `K*model` split holds block model_rank of each of the K groups: K boxes), each with the
// place it has in the local shard; a replicated tensor is one box, the whole of it.
struct TensorParallelBox {
  TensorSlice global;  // in the whole tensor
  TensorSlice local;   // in the local shard
};
std::vector<TensorParallelBox> TensorParallelBoxes(const ir::Sharding& sharding, const Shape& local,
                                                   int model, int model_rank, Shape* whole);

}  // namespace kiln::train

#endif  // KILN_TRAIN_MESH_H_
