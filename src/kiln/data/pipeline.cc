// InputPipeline's engine: batches produced on worker threads (or the caller's), the prefetch
// queue and its auto sizing, and Create / Next. The other concerns have files of their own:
// example sources (internal/example_source.h), epoch order (pipeline_order.cc), saved state
// (pipeline_state.cc), record shard writing (record_shards.cc). See pipeline.h.
#include "kiln/data/pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/base/hash.h"
#include "kiln/base/status.h"
#include "kiln/data/internal/pipeline_impl.h"

namespace kiln::data {

int AutoPrefetchDepth(int current, int max_depth, double produce_max, double produce_mean,
                      double step, double wait_share) {
  int want = current;
  if (step > 0) {
    const double need = 1.0 + std::ceil(produce_max / step);
    want = std::max(want, static_cast<int>(std::min<double>(need, max_depth)));
    // Waits although production keeps up on average: bursts; one more batch of slack.
    if (wait_share > 0.02 && produce_mean < step) want = std::max(want, current + 1);
  }
  return std::max(current, std::min(want, max_depth));
}

int AutoWorkers() {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores / 2, 1, 8);
}

// Fills the batch at (e, pos) into x, y (already of x_type / y_type); *real = rows that are
// examples. Wrap: rows past the epoch's end come from the start of the next epoch's order.
// A pure function of (e, pos): any worker, in any order, fills the same bytes.
absl::Status InputPipeline::Impl::Produce(int64_t e, int64_t pos, Tensor& x, Tensor& y,
                                          int64_t* real, Worker& w) {
  std::shared_ptr<const std::vector<int64_t>> ord = OrderOf(e);
  const int64_t B = config.batch_size;
  const int64_t xb = x_type.shape.num_elements() / B * DTypeSize(x_type.dtype);
  const int64_t y_elems = y_type.shape.num_elements() / B;
  const int64_t yb = y_elems * DTypeSize(y_type.dtype);
  auto* xd = static_cast<uint8_t*>(x.raw_data());
  auto* yd = static_cast<uint8_t*>(y.raw_data());
  *real = 0;
  for (int64_t r = 0, p = pos; r < B; ++r, ++p) {
    if (p >= M() && wrap()) {
      ord = OrderOf(++e);
      p = 0;
    }
    if (p < M()) {
      KILN_RETURN_IF_ERROR(source->Fetch((*ord)[p], xd + r * xb, yd + r * yb, w.reader.get()));
      if (augmenter.has_value()) {
        float* row = reinterpret_cast<float*>(xd + r * xb);
        if (config.split == "held_out") {
          augmenter->ApplyEval(row, w.aug_scratch.data());
        } else {
          augmenter->ApplyTrain(row, config.seed, e, (*ord)[p], w.aug_scratch.data());
        }
      }
      ++*real;
    } else {  // pad: zero features, ignore label (-1 for signed integers, else 0)
      std::memset(xd + r * xb, 0, xb);
      std::memset(yd + r * yb, 0, yb);
      const DType t = y_type.dtype;
      if (t == DType::kS8 || t == DType::kS32 || t == DType::kS64)
        for (int64_t k = 0; k < y_elems; ++k) y.SetDouble(r * y_elems + k, -1.0);
    }
  }
  return absl::OkStatus();
}

void InputPipeline::Impl::Advance(int64_t& e, int64_t& pos) const {
  pos += config.batch_size;
  if (wrap()) {
    for (; pos >= M(); pos -= M()) ++e;
  } else if (pos >= bpe * config.batch_size) {
    pos = 0;
    ++e;
  }
}

InputPipeline::Impl::Worker InputPipeline::Impl::NewWorker() const {
  Worker w;
  w.reader = source->NewReader();
  if (augmenter.has_value()) w.aug_scratch.assign(static_cast<size_t>(augmenter->floats()), 0);
  return w;
}

// Worker k: takes the next batch number and position and a free slot, produces the batch
// outside the lock, and files it under its number.
void InputPipeline::Impl::Loop(int k) {
  Worker& w = workers[k];
  while (true) {
    int slot;
    int64_t seq, e, p;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return stop || (!halted && !free_slots.empty()); });
      if (stop) return;
      slot = free_slots.front();
      free_slots.pop_front();
      seq = next_seq++;
      e = p_epoch;
      p = p_pos;
      Advance(p_epoch, p_pos);
    }
    Slot& s = slots[slot];
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status status = Produce(e, p, s.x, s.y, &s.real, w);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lock(mu);
      // The consumer sees an error when it reaches this batch; every batch before it was
      // handed out already, so it gets those first, and nothing after it is produced.
      if (!status.ok()) halted = true;
      s.status = std::move(status);
      done[seq] = slot;
      win_produce_max = std::max(win_produce_max, took);
      produce_sum += took;
      ++produce_n;
    }
    cv.notify_all();
  }
}

void InputPipeline::Impl::StartThread() {
  if (config.prefetch <= 0) return;
  p_epoch = epoch;
  p_pos = pos;
  done.clear();
  next_seq = deliver_seq = 0;
  halted = false;
  free_slots.clear();
  for (int i = 0; i < active; ++i) free_slots.push_back(i);
  have_last_return = false;  // a restore is not a step
  stop = false;
  for (int k = 0; k < num_workers; ++k) threads.emplace_back([this, k] { Loop(k); });
}

void InputPipeline::Impl::StopThread() {
  if (threads.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
  }
  cv.notify_all();
  for (std::thread& t : threads) t.join();
  threads.clear();
}

// Gives slot k its tensors.
void InputPipeline::Impl::AllocateSlot(int k) {
  slots[k].x = Tensor(x_type.dtype, x_type.shape);
  slots[k].y = Tensor(y_type.dtype, y_type.shape);
  slots[k].status = absl::OkStatus();
}

// kAutoPrefetch, after each window of kAutoWindow batches (consumer thread): the depth that
// covers the window's slowest batch at the consumer's pace (pipeline.h), never shrinking.
void InputPipeline::Impl::MaybeResize() {
  if (!auto_prefetch || win_n < kAutoWindow) return;
  double produce_max, produce_mean;
  {
    std::lock_guard<std::mutex> lock(mu);
    produce_max = win_produce_max;
    produce_mean = produce_n > 0 ? produce_sum / static_cast<double>(produce_n) : 0;
    win_produce_max = 0;
  }
  const double step = win_gap_sum / static_cast<double>(win_n);
  // W workers finish a batch every produce_mean / W seconds on average.
  const int extra = num_workers - 1;
  const int want = extra + AutoPrefetchDepth(depth(), static_cast<int>(slots.size()) - extra,
                                             produce_max, produce_mean / num_workers, step,
                                             win_gap_sum > 0 ? win_wait / win_gap_sum : 0);
  if (want > active) {
    for (int k = active; k < want; ++k) AllocateSlot(k);
    {
      std::lock_guard<std::mutex> lock(mu);
      for (int k = active; k < want; ++k) free_slots.push_back(k);
      active = want;
    }
    cv.notify_all();
  }
  win_n = 0;
  win_gap_sum = 0;
  win_wait = 0;
}

InputPipeline::InputPipeline(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
InputPipeline::~InputPipeline() = default;

namespace {

absl::Status CheckConfig(const PipelineConfig& config) {
  if (config.batch_size < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("data.batch_size must be >= 1, got ", config.batch_size));
  if (config.remainder != "drop" && config.remainder != "pad" &&
      !(config.remainder == "wrap" && internal::IsCsv(config)))
    return absl::InvalidArgumentError(absl::StrCat(
        "data.remainder must be \"drop\" or \"pad\"", internal::IsCsv(config) ? " or \"wrap\"" : "",
        ", got \"", config.remainder, "\"",
        config.remainder == "wrap" ? " (\"wrap\" is for csv: sources only)" : ""));
  if (config.split != "train" && config.split != "held_out")
    return absl::InvalidArgumentError(
        absl::StrCat("data.split must be \"train\" or \"held_out\", got \"", config.split, "\""));
  if (config.num_shards < 1 || config.shard_index < 0 || config.shard_index >= config.num_shards)
    return absl::InvalidArgumentError(
        absl::StrCat("data.shard_index must be in [0, num_shards), got ", config.shard_index,
                     " of ", config.num_shards));
  if (!(config.held_out_fraction >= 0.0 && config.held_out_fraction < 1.0))
    return absl::InvalidArgumentError(
        absl::StrCat("data.held_out_fraction must be in [0, 1), got ", config.held_out_fraction));
  if (config.shuffle_buffer < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("data.shuffle_buffer must be >= 0, got ", config.shuffle_buffer));
  if ((config.prefetch < 0 && config.prefetch != kAutoPrefetch) || config.prefetch > 1024)
    return absl::InvalidArgumentError(
        absl::StrCat("data.prefetch must be auto or in [0, 1024], got ", config.prefetch));
  if ((config.workers < 1 && config.workers != kAutoWorkers) || config.workers > kMaxWorkers)
    return absl::InvalidArgumentError(absl::StrCat("data.workers must be auto or in [1, ",
                                                   kMaxWorkers, "], got ", config.workers));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<InputPipeline>> InputPipeline::Create(const PipelineConfig& config,
                                                                     Env* env) {
  KILN_RETURN_IF_ERROR(CheckConfig(config));
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->env = env;
  KILN_ASSIGN_OR_RETURN(impl->source, internal::OpenExampleSource(config.source, config.seq_len,
                                                                  config.language, env));
  const internal::ExampleSource& src = *impl->source;
  KILN_ASSIGN_OR_RETURN(impl->ids, internal::SelectExamples(config, src));
  const int64_t m = impl->M();
  const std::string what = absl::StrCat(config.source, " (split ", config.split, ", shard ",
                                        config.shard_index, " of ", config.num_shards, ")");
  if (m == 0)
    return absl::InvalidArgumentError(absl::StrCat(what, " has no examples out of ", src.size()));
  if (config.shrink_batch) impl->config.batch_size = std::min(config.batch_size, m);
  const int64_t batch = impl->config.batch_size;
  if (config.remainder != "pad" && m < batch)
    return absl::InvalidArgumentError(absl::StrCat(what, " has ", m,
                                                   " examples, fewer than batch_size ", batch,
                                                   " (use remainder \"pad\" or a smaller batch)"));
  impl->bpe = config.remainder == "pad" ? (m + batch - 1) / batch : m / batch;
  impl->x_type = {src.x_spec().dtype, internal::PrependDim(batch, src.x_spec().shape)};
  impl->y_type = {src.y_spec().dtype, internal::PrependDim(batch, src.y_spec().shape)};
  impl->fingerprint = Fnv1a64(src.FingerprintMaterial());
  if (config.augment.enabled()) {
    if (src.x_spec().dtype != DType::kF32)
      return absl::InvalidArgumentError(absl::StrCat("data.augment: needs f32 image features; ",
                                                     config.source, " gives ",
                                                     src.x_spec().ToString()));
    KILN_ASSIGN_OR_RETURN(Augmenter a,
                          Augmenter::Create(config.augment, src.x_spec().shape.num_elements()));
    impl->augmenter.emplace(std::move(a));
  }
  impl->num_workers = config.workers == kAutoWorkers ? AutoWorkers() : config.workers;
  impl->caller = impl->NewWorker();
  if (config.prefetch != 0) {
    for (int k = 0; k < impl->num_workers; ++k) impl->workers.push_back(impl->NewWorker());
  } else {
    impl->num_workers = 1;  // the caller produces each batch itself
  }
  int max_slots = config.prefetch;
  if (config.prefetch == kAutoPrefetch) {
    impl->auto_prefetch = true;
    const int64_t batch_bytes =
        std::max<int64_t>(1, impl->x_type.shape.num_elements() * DTypeSize(impl->x_type.dtype) +
                                 impl->y_type.shape.num_elements() * DTypeSize(impl->y_type.dtype));
    max_slots = static_cast<int>(std::clamp<int64_t>((int64_t{256} << 20) / batch_bytes, 2, 16));
    impl->config.prefetch = 2;  // the starting depth (> 0: the thread runs)
  }
  // Each worker beyond the first gets a slot of its own (see Impl::Slot).
  const int extra = impl->num_workers - 1;
  impl->slots.resize(static_cast<size_t>(std::max(max_slots, 0) + (max_slots > 0 ? extra : 0)));
  impl->active = (impl->auto_prefetch ? 2 : max_slots) + (max_slots > 0 ? extra : 0);
  for (int i = 0; i < impl->active; ++i) impl->AllocateSlot(i);
  impl->StartThread();
  return std::unique_ptr<InputPipeline>(new InputPipeline(std::move(impl)));
}

const TensorSpec& InputPipeline::feature_type() const { return impl_->x_type; }
const TensorSpec& InputPipeline::label_type() const { return impl_->y_type; }
int64_t InputPipeline::epoch() const { return impl_->epoch; }
int64_t InputPipeline::epoch_of_last_batch() const {
  return impl_->pos > 0 ? impl_->epoch : std::max<int64_t>(impl_->epoch - 1, 0);
}
int64_t InputPipeline::source_examples() const { return impl_->source->size(); }
int64_t InputPipeline::examples_seen() const { return impl_->seen; }
int64_t InputPipeline::last_real_examples() const { return impl_->last_real; }
int64_t InputPipeline::examples_per_epoch() const { return impl_->M(); }
int64_t InputPipeline::batches_per_epoch() const { return impl_->bpe; }
int InputPipeline::prefetch_depth() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->config.prefetch > 0 ? impl_->depth() : 0;
}
int InputPipeline::workers() const { return impl_->config.prefetch > 0 ? impl_->num_workers : 0; }
double InputPipeline::mean_produce_seconds() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->produce_n > 0 ? impl_->produce_sum / static_cast<double>(impl_->produce_n) : 0;
}
double InputPipeline::mean_step_seconds() const {
  return impl_->gap_n > 0 ? impl_->gap_sum / static_cast<double>(impl_->gap_n) : 0;
}

absl::Status InputPipeline::Next(Tensor& x, Tensor& y) {
  Impl& m = *impl_;
  if (!m.sticky.ok()) return m.sticky;
  if (x.dtype() != m.x_type.dtype || x.shape() != m.x_type.shape || y.dtype() != m.y_type.dtype ||
      y.shape() != m.y_type.shape)
    return absl::InvalidArgumentError(
        absl::StrCat("InputPipeline::Next: got tensors ", x.TypeString(), " and ", y.TypeString(),
                     ", expected ", m.x_type.ToString(), " and ", m.y_type.ToString()));
  int64_t real = 0;
  if (m.config.prefetch <= 0) {
    absl::Status s = m.Produce(m.epoch, m.pos, x, y, &real, m.caller);
    if (!s.ok()) {
      m.sticky = s;
      return s;
    }
  } else {
    using SteadyClock = std::chrono::steady_clock;
    const SteadyClock::time_point enter = SteadyClock::now();
    if (m.have_last_return) {  // the consumer's time since the last batch: its step
      const double gap = std::chrono::duration<double>(enter - m.last_return).count();
      m.win_gap_sum += gap;
      m.gap_sum += gap;
      ++m.win_n;
      ++m.gap_n;
    }
    int slot;
    {
      std::unique_lock<std::mutex> lock(m.mu);
      m.cv.wait(lock, [&] { return m.done.count(m.deliver_seq) > 0; });
      auto it = m.done.find(m.deliver_seq++);
      slot = it->second;
      m.done.erase(it);
    }
    const SteadyClock::time_point got = SteadyClock::now();
    m.win_wait += std::chrono::duration<double>(got - enter).count();
    Impl::Slot& s = m.slots[slot];
    if (!s.status.ok()) {
      m.sticky = s.status;
      return s.status;
    }
    std::memcpy(x.raw_data(), s.x.raw_data(), x.byte_size());
    std::memcpy(y.raw_data(), s.y.raw_data(), y.byte_size());
    real = s.real;
    {
      std::lock_guard<std::mutex> lock(m.mu);
      m.free_slots.push_back(slot);
    }
    m.cv.notify_all();
    m.MaybeResize();
    m.last_return = SteadyClock::now();
    m.have_last_return = true;
  }
  m.seen += real;
  m.last_real = real;
  m.Advance(m.epoch, m.pos);
  return absl::OkStatus();
}

}  // namespace kiln::data
