// The compile cache: remembers the OPTIMIZED graph (compiler::Optimize's output) for a given input
// graph, compiler version, result-changing options and backend, in memory (LRU) and on disk, so
// a process that compiles the same model again (the next step, the next run, a restarted job)
// skips the pass pipeline. Backends call it in place of Optimize:
//
//   compiler::CompileCache cache({.dir = "/var/cache/kiln"});   // owned by the caller
//   compiler::CompileOptions opts = ...;                 // the same options Optimize would get
//   KILN_ASSIGN_OR_RETURN(ir::Graph optimized,
//       cache.GetOrOptimize(graph, opts, "cpu/avx512-bf16"));
//   ... lower `optimized` to thunks ...
// (compiler::Compile does this when given a cache; the kiln CLI makes one per process.)
//
// The key is the SHA-256 (internal/sha256.h) of, each length-prefixed:
//   - the canonical IR text of the input graph (ir::PrintGraph) with the graph's name blanked
//     (the name is debug information: it is restored on a hit),
//   - kCompilerVersion (version.h),
//   - CanonicalOptionsString(options): every CompileOptions field that can change the result
//     (disabled passes; per composite op whether keep_composite keeps it; the constant-folding
//     limit; the fixed-point round cap; loop fusion; the remat options, with whether a backend
//     `measure` hook is set),
//   - the backend key supplied by the caller: backend name and ISA ("cpu/avx512-bf16").
// Fields that only affect diagnostics (verify_each_pass, dump_dir, env) are left out; but when IR
// dumps are requested (dump_dir) the lookup is skipped so the passes run and dump, and the result
// is stored as usual.
//
// On disk each entry is one file <dir>/compile/<64 hex key>.kcc, laid out byte by byte in
// docs/formats.md ("Compile cache"): a fixed 80-byte header (magic, version, key, CRC32C of the
// header and of the body), a human-readable description of the key's parts, and the optimized
// program as IR text. Entries are written to a temporary name and renamed (readers never see a
// partial file). A corrupt, truncated or mismatched entry is a miss (logged) and is rewritten;
// a write failure is logged and otherwise ignored: the cache never makes a compile fail.
//
// Every miss logs its reason (KILN_LOG, or options.log), e.g.
//   kiln compile cache: miss for graph 'train_step' (new key: options changed; no entry on disk)
// and when one graph name is seen with `recompile_warning_threshold` or more distinct parameter
// shape signatures, every further new one warns, naming the parameters that changed.
//
// Thread-safe. Two threads missing on the same key both optimize (the result is the same); the
// in-memory map and the statistics are guarded by a mutex, the pipeline runs outside it.
#ifndef KILN_COMPILER_CACHE_H_
#define KILN_COMPILER_CACHE_H_

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "kiln/compiler/compile.h"
#include "kiln/ir/graph.h"

namespace kiln::compiler {

// Counters. GetOrOptimize adds its outcome to the caller's CacheStats (pass a fresh one to see
// one call) and to the cache's totals (CompileCache::stats()).
struct CacheStats {
  int64_t memory_hits = 0;
  int64_t disk_hits = 0;
  int64_t misses = 0;
  int64_t corrupt_entries = 0;  // disk entries found unreadable or inconsistent (counted as misses)
  int64_t disk_write_errors = 0;  // entries that could not be stored (logged, not fatal)
  int64_t recompile_warnings = 0;
  double seconds_optimizing = 0;  // time spent in Optimize on misses
  double seconds_saved = 0;       // the original Optimize time of every entry served from cache
  double seconds_lookup = 0;      // time spent hashing, reading and parsing on lookups

  int64_t hits() const { return memory_hits + disk_hits; }
  void Add(const CacheStats& o);
  // "3 hits (2 memory, 1 disk), 1 miss, saved 1.234 s"
  std::string ToString() const;
};

struct CompileCacheOptions {
  // Root folder; entries go under <dir>/compile/. Empty: no disk tier (the cache reads no
  // environment; the kiln CLI passes $KILN_CACHE_DIR here).
  std::string dir;
  bool use_disk = true;
  // In-memory LRU capacity (entries); 0 disables the memory tier.
  int memory_capacity = 64;
  // Warn once a graph name has been seen with this many distinct parameter-shape signatures.
  int recompile_warning_threshold = 3;
  // Filesystem for the disk tier; null means Env::Default().
  Env* env = nullptr;
  // Where miss reasons and warnings go; null means KILN_LOG(INFO).
  std::function<void(const std::string&)> log;
};

// The canonical text of the result-changing fields of `options`, one "name=value" per line.
// When CompileOptions gains a field that changes Optimize's output, add it here.
std::string CanonicalOptionsString(const CompileOptions& options);

// The key of docs/formats.md ("Compile cache") from its parts: SHA-256 hex of the
// length-prefixed fields. CompileCache::Key uses it with kCompilerVersion.
std::string ComputeCacheKey(const std::string& canonical_ir, const std::string& compiler_version,
                            const std::string& canonical_options, const std::string& backend_key);

// Parameter "name:type" list in index order, e.g. "x:f32[32,784], w:f32[784,10]".
std::string ShapeSignature(const ir::Graph& graph);

class CompileCache {
 public:
  explicit CompileCache(CompileCacheOptions options = {});
  CompileCache(const CompileCache&) = delete;
  CompileCache& operator=(const CompileCache&) = delete;

  // The optimized graph for `graph`: from memory, else from disk, else Optimize(graph, options)
  // (then stored in both tiers). Errors are only Optimize's (an invalid graph, a pass error).
  absl::StatusOr<ir::Graph> GetOrOptimize(const ir::Graph& graph, const CompileOptions& options,
                                          const std::string& backend_key,
                                          CacheStats* stats = nullptr);

  // The key GetOrOptimize would use (64 lowercase hex characters).
  std::string Key(const ir::Graph& graph, const CompileOptions& options,
                  const std::string& backend_key) const;
  // Where the entry for `key` lives on disk ("" without a disk tier).
  std::string EntryPath(const std::string& key) const;
  const std::string& disk_dir() const { return disk_dir_; }  // <root>/compile, or ""

  CacheStats stats() const;
  // Empties the memory tier (the disk tier and the recompile history are kept).
  void ClearMemory();

 private:
  struct KeyParts {
    std::string ir_text, options, backend;
    std::string ir_hash;  // of ir_text, for comparing with earlier keys of the same name
    std::string signature;
  };
  struct MemEntry {
    std::string key;
    ir::Graph graph;
    double optimize_seconds = 0;
  };
  struct NameHistory {
    KeyParts last;
    std::vector<std::string> signatures;  // distinct, in first-seen order
  };

  KeyParts MakeKeyParts(const ir::Graph& graph, const CompileOptions& options,
                        const std::string& backend_key) const;
  static std::string KeyOf(const KeyParts& parts);
  void Log(const std::string& message) const;
  // Looks the key up on disk. On a hit fills *graph and *optimize_seconds; on a miss returns
  // false with the reason in *why (and counts a corrupt entry).
  bool ReadDisk(const std::string& key, const ir::Graph& input, ir::Graph* graph,
                double* optimize_seconds, std::string* why, CacheStats* delta);
  void WriteDisk(const std::string& key, const KeyParts& parts, const std::string& graph_name,
                 const ir::Graph& optimized, double optimize_seconds, CacheStats* delta);
  // Records this compile in the per-name history; returns the "new key: ..." explanation.
  // Both are called with mu_ held and return the recompile warning to log (or "").
  std::string NoteMissAndExplain(const std::string& name, const KeyParts& parts,
                                 std::string* warning, CacheStats* delta);
  std::string NoteSignature(const std::string& name, const KeyParts& parts, CacheStats* delta);
  void InsertMemory(const std::string& key, const ir::Graph& graph, double optimize_seconds);

  CompileCacheOptions options_;
  Env* env_;
  std::string disk_dir_;

  mutable std::mutex mu_;
  std::list<MemEntry> lru_;  // most recent first
  std::unordered_map<std::string, std::list<MemEntry>::iterator> index_;
  std::map<std::string, NameHistory> history_;
  CacheStats totals_;
};

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_CACHE_H_
