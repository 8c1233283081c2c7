#include "kiln/serve/served_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kiln/base/log.h"
#include "kiln/base/status.h"
#include "kiln/serve/rebatch.h"

namespace kiln::serve {
namespace {

using compiler::TensorSpec;

// Deterministic inputs for the warm-up check: floats in [-1, 1), integers 0 or 1.
void FillCheckData(Tensor& t, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    if (IsInteger(t.dtype()) || t.dtype() == DType::kBool) {
      t.SetDouble(i, static_cast<double>(x & 1));
    } else {
      t.SetDouble(i, static_cast<double>(x >> 11) / static_cast<double>(1ull << 52) - 1.0);
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServedModel>> ServedModel::Load(
    const std::string& dir, const std::string& name, const std::string& version,
    const BatchingConfig& config, runtime::Backend* backend, Clock* clock) {
  const std::string what = absl::StrCat("model ", name, " version ", version, " (", dir, ")");
  absl::Status valid = config.Validate();
  if (!valid.ok()) return Annotate(valid, what + ": batching config");
  absl::StatusOr<compiler::Artifact> a = compiler::LoadArtifact(dir);
  if (!a.ok()) return Annotate(a.status(), what);
  std::unique_ptr<ServedModel> m(new ServedModel());
  m->dir_ = dir;
  m->name_ = name;
  m->version_ = version;
  m->inputs_ = a->signature.RuntimeInputs();
  m->outputs_ = a->signature.outputs;
  if (m->inputs_.empty())
    return absl::InvalidArgumentError(what + ": the artifact takes no runtime inputs");
  for (const auto* list : {&m->inputs_, &m->outputs_}) {
    for (const TensorSpec& s : *list) {
      const int64_t b = s.shape.rank() > 0 ? s.shape.dim(0) : -1;
      if (b < 1 || (m->artifact_batch_ != 0 && b != m->artifact_batch_)) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": '", s.name, "' is ", std::string(DTypeName(s.dtype)), s.shape.ToString(),
            "; serving needs every runtime input and output to share one leading batch "
            "dimension"));
      }
      m->artifact_batch_ = b;
    }
  }
  absl::StatusOr<std::optional<InputNormalization>> norm = InputNormalizationOf(*a);
  if (!norm.ok()) return Annotate(norm.status(), what);
  m->normalization_ = std::move(*norm);
  if (m->normalization_) {
    for (size_t i = 0; i < m->inputs_.size(); ++i)
      if (m->inputs_[i].name == m->normalization_->input)
        m->normalized_input_ = static_cast<int>(i);
    if (m->normalized_input_ < 0)  // InputNormalizationOf checked it is a runtime input
      return absl::InternalError(what + ": the normalized input is not a runtime input");
  }
  m->sizes_ = config.BatchSizes();
  // The exported batch size runs the artifact's own program (no rebatching): compiled too, so a
  // small batch is not padded past it.
  if (m->artifact_batch_ <= config.max_batch_size &&
      !std::binary_search(m->sizes_.begin(), m->sizes_.end(), m->artifact_batch_)) {
    m->sizes_.insert(std::lower_bound(m->sizes_.begin(), m->sizes_.end(), m->artifact_batch_),
                     m->artifact_batch_);
  }
  m->slots_.resize(config.instances);
  KILN_RETURN_IF_ERROR(Annotate(m->Compile(*a, backend), what));
  KILN_RETURN_IF_ERROR(Annotate(m->CheckRebatched(*a, backend), what));
  m->clock_ = clock != nullptr ? clock : RealClock::Get();
  ServedModel* raw = m.get();
  m->batcher_ = std::make_unique<DynamicBatcher>(
      config,
      [raw](int instance, std::vector<BatchRequest*>& batch, int64_t rows) {
        return raw->RunBatch(instance, batch, rows);
      },
      clock);
  return m;
}

ServedModel::~ServedModel() { Stop(); }

absl::Status ServedModel::Compile(const compiler::Artifact& a, runtime::Backend* backend) {
  std::set<std::string> batched;
  for (const TensorSpec& s : inputs_) batched.insert(s.name);
  for (int64_t size : sizes_) {
    ir::Graph program;
    if (size == artifact_batch_) {
      program = a.program;
    } else {
      KILN_ASSIGN_OR_RETURN(program, Rebatch(a.program, batched, artifact_batch_, size));
    }
    for (auto& per_instance : slots_) {
      Slot slot;
      slot.size = size;
      absl::StatusOr<std::unique_ptr<runtime::Executable>> exe = backend->Compile(program);
      if (!exe.ok()) return Annotate(exe.status(), absl::StrCat("compiling at batch size ", size));
      slot.exe = std::move(*exe);
      KILN_ASSIGN_OR_RETURN(FixedBatchRunner runner,
                            FixedBatchRunner::ForArtifact(*slot.exe, a, size));
      std::map<int, Tensor> weights;
      const std::vector<int>& input_args = runner.input_args();
      for (size_t k = 0; k < runner.args().size(); ++k) {
        if (std::find(input_args.begin(), input_args.end(), static_cast<int>(k)) ==
            input_args.end())
          weights[static_cast<int>(k)] = runner.args()[k];
      }
      // The weights never change while served: bound constant, so the backend packs them once
      // now into the layouts its kernels stream (runtime/cpu/internal/gemv.h).
      KILN_RETURN_IF_ERROR(Annotate(slot.exe->BindConstantParameters(weights),
                                    absl::StrCat("binding the weights at batch size ", size)));
      // Warm-up: the first run allocates the arena and primes the kernels.
      absl::StatusOr<std::vector<Tensor>> r = runner.Run(size);
      slot.runner.emplace(std::move(runner));
      if (!r.ok()) return Annotate(r.status(), absl::StrCat("warm-up run at batch size ", size));
      per_instance.push_back(std::move(slot));
    }
  }
  return absl::OkStatus();
}

// Every compiled size must compute what the exported program computes on the same rows.
absl::Status ServedModel::CheckRebatched(const compiler::Artifact& a, runtime::Backend* backend) {
  std::unique_ptr<runtime::Executable> original;
  std::optional<FixedBatchRunner> at_artifact_batch;  // the exported program, zero-padded
  for (size_t k = 0; k < sizes_.size(); ++k) {
    Slot& slot = slots_[0][k];
    if (slot.size == artifact_batch_) continue;
    if (original == nullptr) {
      KILN_ASSIGN_OR_RETURN(original, backend->Compile(a.program));
      KILN_ASSIGN_OR_RETURN(FixedBatchRunner r, FixedBatchRunner::ForArtifact(*original, a));
      at_artifact_batch.emplace(std::move(r));
    }
    std::vector<const Tensor*> rows;
    for (size_t i = 0; i < slot.runner->num_inputs(); ++i) {
      FillCheckData(slot.runner->input_buffer(i), i + 1);
      rows.push_back(&slot.runner->input_buffer(i));
    }
    KILN_ASSIGN_OR_RETURN(std::vector<Tensor> got, slot.runner->Run(slot.size));
    std::vector<Tensor> mine;
    for (const Tensor& t : got) mine.push_back(t.Clone());
    // The same rows through the exported program, artifact_batch_ at a time.
    KILN_RETURN_IF_ERROR(at_artifact_batch->RunRows(
        rows, slot.size,
        [&](const std::vector<Tensor>& want, int64_t start, int64_t take) -> absl::Status {
          for (size_t o = 0; o < want.size(); ++o) {
            const int64_t per = want[o].num_elements() / artifact_batch_;
            for (int64_t j = 0; j < take * per; ++j) {
              const double w = want[o].GetDouble(j), g = mine[o].GetDouble(start * per + j);
              if (!(std::fabs(w - g) <= 1e-4 + 1e-3 * std::fabs(w))) {
                return absl::FailedPreconditionError(absl::StrCat(
                    "at batch size ", slot.size, " the rebatched program computes ", g, " for '",
                    outputs_[o].name, "' element ", start * per + j,
                    " where the exported program (batch ", artifact_batch_, ") computes ", w,
                    "; serve at the artifact's batch size or export at the sizes you need"));
              }
            }
          }
          return absl::OkStatus();
        }));
  }
  return absl::OkStatus();
}

absl::Status ServedModel::Submit(std::unique_ptr<BatchRequest> request) {
  return batcher_->Enqueue(std::move(request));
}

void ServedModel::Stop() {
  if (batcher_) batcher_->Stop();
}

absl::Status ServedModel::RunBatch(int instance, std::vector<BatchRequest*>& batch, int64_t rows) {
  const int64_t start_us = clock_->NowMicros();
  auto it = std::lower_bound(sizes_.begin(), sizes_.end(), rows);
  if (it == sizes_.end())
    return absl::InternalError(absl::StrCat("a batch of ", rows, " rows exceeds every size"));
  Slot& slot = slots_[instance][it - sizes_.begin()];
  FixedBatchRunner& runner = *slot.runner;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    int64_t at = 0;
    for (BatchRequest* r : batch) {
      const Tensor& in = r->inputs[i];
      if (!runner.Stage(i, at, r->rows, in.raw_data(), in.byte_size()).ok())
        return absl::InternalError(absl::StrCat("input '", inputs_[i].name, "' of ",
                                                in.TypeString(), " for ", r->rows, " rows"));
      at += r->rows;
    }
    // The training pipeline's normalization, on the real rows (Load checked the input is f32
    // of C*H*W values per row).
    if (static_cast<int>(i) == normalized_input_) {
      const int64_t per = runner.row_bytes(i) / static_cast<int64_t>(sizeof(float));
      float* f = runner.input_buffer(i).data<float>();
      for (int64_t k = 0; k < at; ++k) normalization_->ApplyToExample(f + k * per);
    }
  }
  absl::StatusOr<std::vector<Tensor>> outs = runner.Run(rows);  // zero-pads the rest
  if (!outs.ok()) return outs.status();
  for (size_t o = 0; o < outs->size(); ++o) {
    const Tensor& t = (*outs)[o];
    int64_t at = 0;
    for (BatchRequest* r : batch) {
      if (o == 0) r->outputs.clear();
      r->outputs.push_back(FixedBatchRunner::Rows(t, slot.size, at, r->rows));
      at += r->rows;
    }
  }
  if (observer_) {
    observer_(BatchStats{rows, slot.size, clock_->NowMicros() - start_us});
  }
  return absl::OkStatus();
}

}  // namespace kiln::serve
