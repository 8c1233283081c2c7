// The input pipeline's engine state (pipeline.h), shared by the files of its concerns:
// pipeline.cc (workers, prefetch, batches), pipeline_order.cc (which examples, in which order)
// and pipeline_state.cc (save / restore). Nothing outside those files includes it.
//
//   InputPipeline::Impl& m = *impl_;
//   std::shared_ptr<const std::vector<int64_t>> order = m.OrderOf(m.epoch);  // epoch's order
//   KILN_RETURN_IF_ERROR(m.Produce(m.epoch, m.pos, x, y, &real, m.caller));
#ifndef KILN_DATA_INTERNAL_PIPELINE_IMPL_H_
#define KILN_DATA_INTERNAL_PIPELINE_IMPL_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/data/augment.h"
#include "kiln/data/internal/example_source.h"
#include "kiln/data/pipeline.h"
#include "nlohmann/json.hpp"

namespace kiln::data {

class InputPipeline::Impl {
 public:
  PipelineConfig config;
  Env* env = nullptr;
  std::unique_ptr<internal::ExampleSource> source;
  // Kept global indices: ascending, except for csv: sources (their split's permuted order).
  std::vector<int64_t> ids;
  TensorSpec x_type, y_type;
  int64_t bpe = 0;  // batches per epoch (wrap: whole batches that fit in one epoch)
  uint64_t fingerprint = 0;

  // Consumer position: the next batch Next() returns starts at example `pos` of epoch `epoch`'s
  // order (drop, pad: pos = batch_in_epoch * batch_size).
  int64_t epoch = 0, pos = 0, seen = 0;
  int64_t last_real = 0;
  absl::Status sticky;

  // The next batch to hand to a worker (under mu; the caller's own when prefetch = 0 or while
  // the workers are stopped).
  int64_t p_epoch = 0, p_pos = 0;
  // The order cache, shared by the workers (under order_mu): two epochs' orders, since a wrapped
  // batch reads the end of one and the start of the next. A worker holds a reference to the
  // orders it reads, so replacing one never pulls it from under a batch being produced.
  std::mutex order_mu;
  int64_t order_epoch[2] = {-1, -1};
  std::shared_ptr<const std::vector<int64_t>> order[2];

  // Augmentation (augment.h) on the producing threads (const: each worker has its own scratch).
  std::optional<Augmenter> augmenter;

  // What one producing thread owns: its source reader (open files) and augmentation scratch.
  struct Worker {
    std::unique_ptr<internal::ExampleSource::Reader> reader;
    std::vector<float> aug_scratch;
  };
  Worker caller;  // the caller's thread, with prefetch = 0
  std::vector<Worker> workers;
  int num_workers = 1;  // threads producing batches when prefetch > 0 (PipelineConfig::workers)

  // Prefetch queue: `slots` has room for the most batches the queue may hold (never
  // reallocated: a worker keeps a reference into it), the first `active` have their tensors.
  // With W workers the queue has depth + W - 1 slots: each worker beyond the first has one batch
  // of its own in production, so `depth` batches can still be ready ahead.
  struct Slot {
    Tensor x, y;
    int64_t real = 0;
    absl::Status status;
  };
  std::vector<Slot> slots;
  int active = 0;
  bool auto_prefetch = false;
  int depth() const { return active - (num_workers - 1); }
  // Auto sizing (kAutoPrefetch): the producer's batch times (under mu) and the consumer's time
  // between Next() calls, over a window of kAutoWindow batches.
  static constexpr int kAutoWindow = 16;
  double win_produce_max = 0, produce_sum = 0;
  int64_t produce_n = 0;
  double win_gap_sum = 0, win_wait = 0, gap_sum = 0;
  int64_t win_n = 0, gap_n = 0;
  std::chrono::steady_clock::time_point last_return;
  bool have_last_return = false;
  std::mutex mu;
  std::condition_variable cv;
  // Batches are numbered in the order they are handed out (next_seq); a finished one waits in
  // `done` (number -> slot) until the consumer reaches its number (deliver_seq), so batches come
  // out in order whichever worker finished first.
  std::deque<int> free_slots;
  std::map<int64_t, int> done;
  int64_t next_seq = 0, deliver_seq = 0;
  bool halted = false;  // a batch failed: hand out no more (the consumer stops at that one)
  bool stop = false;
  std::vector<std::thread> threads;

  ~Impl() { StopThread(); }

  int64_t M() const { return static_cast<int64_t>(ids.size()); }
  bool wrap() const { return config.remainder == "wrap"; }

  std::shared_ptr<const std::vector<int64_t>> OrderOf(int64_t e);

  std::vector<int64_t> ComputeOrder(int64_t e) const;

  // Fills the batch at (e, pos) into x, y (already of x_type / y_type); *real = rows that are
  // examples. Wrap: rows past the epoch's end come from the start of the next epoch's order.
  // A pure function of (e, pos): any worker, in any order, fills the same bytes.
  absl::Status Produce(int64_t e, int64_t pos, Tensor& x, Tensor& y, int64_t* real, Worker& w);

  void Advance(int64_t& e, int64_t& pos) const;

  Worker NewWorker() const;

  // Worker k: takes the next batch number and position and a free slot, produces the batch
  // outside the lock, and files it under its number.
  void Loop(int k);

  void StartThread();

  void StopThread();

  nlohmann::json ConfigJson() const;

  // Gives slot k its tensors.
  void AllocateSlot(int k);

  // kAutoPrefetch, after each window of kAutoWindow batches (consumer thread): the depth that
  // covers the window's slowest batch at the consumer's pace (pipeline.h), never shrinking.
  void MaybeResize();
};

namespace internal {

// csv: sources split and order as a trainer's plain CSV path always did (pipeline.h).
inline bool IsCsv(const PipelineConfig& c) { return c.source.rfind("csv:", 0) == 0; }

// The global indices of the examples of this host's share of config.split, in source order (csv:
// sources: in the order of their permuted split, data::SplitExampleIndices). pipeline_order.cc.
absl::StatusOr<std::vector<int64_t>> SelectExamples(const PipelineConfig& config,
                                                    const ExampleSource& source);

}  // namespace internal
}  // namespace kiln::data

#endif  // KILN_DATA_INTERNAL_PIPELINE_IMPL_H_
