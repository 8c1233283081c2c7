#include "kiln/compiler/cache.h"

#include <chrono>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/coding.h"
#include "kiln/base/crc32c.h"
#include "kiln/base/log.h"
#include "kiln/base/status.h"
#include "kiln/compiler/internal/sha256.h"
#include "kiln/compiler/version.h"
#include "kiln/ir/opcode.h"
#include "kiln/ir/parser.h"
#include "kiln/ir/printer.h"

namespace kiln::compiler {
namespace {

// ---- on-disk entry layout (docs/formats.md, "Compile cache") ----
constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'C', 'A', 'C', 'H'};
constexpr uint32_t kEntryVersion = 1;
constexpr size_t kHeaderBytes = 80;
constexpr char kEntrySuffix[] = ".kcc";

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void PutU32(std::string& s, size_t at, uint32_t v) { EncodeFixed32(&s[at], v); }
void PutU64(std::string& s, size_t at, uint64_t v) { EncodeFixed64(&s[at], v); }
uint32_t GetU32(const std::string& s, size_t at) { return DecodeFixed32(s.data() + at); }
uint64_t GetU64(const std::string& s, size_t at) { return DecodeFixed64(s.data() + at); }

std::string HexToBytes(const std::string& hex) {
  std::string out(hex.size() / 2, '\0');
  auto nib = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<char>((nib(hex[2 * i]) << 4) | nib(hex[2 * i + 1]));
  return out;
}

std::vector<std::pair<std::string, std::string>> ParamTypes(const ir::Graph& g) {
  std::vector<std::pair<std::string, std::string>> out;
  for (int id : g.parameters()) {
    const ir::Node& n = g.node(id);
    std::string name = n.has_attr("name") ? n.attr_str("name") : absl::StrCat("#", id);
    out.emplace_back(name, n.type().ToString());
  }
  return out;
}

std::map<std::string, std::string> ParseSignature(const std::string& sig) {
  // "a:f32[1], b:f32[2]" -> {a: f32[1], b: f32[2]}. Names may not contain ", " in practice;
  // this is only for the human-readable diff.
  std::map<std::string, std::string> out;
  size_t start = 0;
  while (start < sig.size()) {
    size_t end = sig.find(", ", start);
    if (end == std::string::npos) end = sig.size();
    std::string item = sig.substr(start, end - start);
    size_t colon = item.rfind(':');
    if (colon != std::string::npos) out[item.substr(0, colon)] = item.substr(colon + 1);
    start = end + 2;
  }
  return out;
}

std::string DescribeShapeChange(const std::string& before, const std::string& after) {
  std::map<std::string, std::string> a = ParseSignature(before), b = ParseSignature(after);
  std::vector<std::string> parts;
  for (const auto& [name, type] : b) {
    auto it = a.find(name);
    if (it == a.end())
      parts.push_back(absl::StrCat(name, ": new parameter ", type));
    else if (it->second != type)
      parts.push_back(absl::StrCat(name, ": ", it->second, " -> ", type));
  }
  for (const auto& [name, type] : a)
    if (!b.count(name)) parts.push_back(absl::StrCat(name, ": removed (was ", type, ")"));
  // The first few changes name the cause; a whole other model (hundreds of parameters) would
  // bury the advice after them.
  constexpr size_t kMaxListed = 6;
  std::string out;
  for (size_t i = 0; i < parts.size() && i < kMaxListed; ++i) out += (i ? ", " : "") + parts[i];
  if (parts.size() > kMaxListed)
    absl::StrAppend(&out, ", and ", parts.size() - kMaxListed, " more parameters");
  return out;
}

std::string DescribeOptionsChange(const std::string& before, const std::string& after) {
  auto lines = [](const std::string& s) {
    std::map<std::string, std::string> m;
    size_t start = 0;
    while (start < s.size()) {
      size_t end = s.find('\n', start);
      if (end == std::string::npos) end = s.size();
      std::string line = s.substr(start, end - start);
      size_t eq = line.find('=');
      if (eq != std::string::npos) m[line.substr(0, eq)] = line.substr(eq + 1);
      start = end + 1;
    }
    return m;
  };
  std::map<std::string, std::string> a = lines(before), b = lines(after);
  std::string out;
  for (const auto& [k, v] : b) {
    auto it = a.find(k);
    std::string old = it == a.end() ? "<unset>" : it->second;
    if (old != v) out += absl::StrCat(out.empty() ? "" : "; ", k, ": '", old, "' -> '", v, "'");
  }
  return out;
}

// True when `optimized` has the parameters and output names (and donations) of `input` (a guard
// against a colliding or misplaced entry).
bool SameInterface(const ir::Graph& input, const ir::Graph& optimized) {
  if (ParamTypes(input) != ParamTypes(optimized)) return false;
  if (input.outputs().size() != optimized.outputs().size()) return false;
  for (size_t i = 0; i < input.outputs().size(); ++i)
    if (input.outputs()[i].name != optimized.outputs()[i].name ||
        input.outputs()[i].in_place_of != optimized.outputs()[i].in_place_of)
      return false;
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// CacheStats

void CacheStats::Add(const CacheStats& o) {
  memory_hits += o.memory_hits;
  disk_hits += o.disk_hits;
  misses += o.misses;
  corrupt_entries += o.corrupt_entries;
  disk_write_errors += o.disk_write_errors;
  recompile_warnings += o.recompile_warnings;
  seconds_optimizing += o.seconds_optimizing;
  seconds_saved += o.seconds_saved;
  seconds_lookup += o.seconds_lookup;
}

std::string CacheStats::ToString() const {
  std::string s = absl::StrFormat(
      "%d hits (%d memory, %d disk), %d misses, saved %.3f s, "
      "optimized %.3f s, lookups %.3f s",
      hits(), memory_hits, disk_hits, misses, seconds_saved, seconds_optimizing, seconds_lookup);
  if (corrupt_entries) s += absl::StrFormat(", %d corrupt entries", corrupt_entries);
  if (disk_write_errors) s += absl::StrFormat(", %d write errors", disk_write_errors);
  if (recompile_warnings) s += absl::StrFormat(", %d recompile warnings", recompile_warnings);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Key

std::string CanonicalOptionsString(const CompileOptions& options) {
  std::set<std::string> disabled(options.pipeline.disabled_passes.begin(),
                                 options.pipeline.disabled_passes.end());
  std::string s = "disabled_passes=";
  bool first = true;
  for (const std::string& d : disabled) {
    s += (first ? "" : ",") + d;
    first = false;
  }
  s += "\nkeep_composite=";
  first = true;
  for (int i = 0; i < ir::kNumOpcodes; ++i) {
    ir::Opcode op = static_cast<ir::Opcode>(i);
    if (!ir::IsComposite(op)) continue;
    bool keep = options.keep_composite && options.keep_composite(op);
    s += std::string(first ? "" : ",") + std::string(ir::OpcodeName(op)) +
         (keep ? ":keep" : ":decompose");
    first = false;
  }
  s += absl::StrCat("\nmax_fold_elements=", options.max_fold_elements);
  s += absl::StrCat("\nmax_fixed_point_rounds=", options.pipeline.max_fixed_point_rounds);
  s += absl::StrCat("\nfuse_loops=", options.fuse_loops ? 1 : 0);
  const RematOptions& r = options.remat;
  if (r.enabled || r.memory_limit_bytes > 0) {
    s +=
        absl::StrCat("\nremat=on,memory_limit_bytes=", r.memory_limit_bytes, ",min_gap=", r.min_gap,
                     ",max_chain=", r.max_chain, ",max_recomputed=", r.max_recomputed,
                     ",measure=", r.measure ? "backend" : "model");
  } else {
    s += "\nremat=off";
  }
  // The overlap-collectives pass runs for such backends (only then: older keys stay as they were).
  if (options.traits.async_collectives) s += "\nasync_collectives=1";
  // The program options: the keyed graph is the program pipeline's output, so they are in it
  // already; named too where set, so a miss can say so (unset: older keys stay as they were).
  const ProgramOptions& program = options.program;
  if (program.precision != PrecisionPolicy::kF32)
    s += "\nprecision=" + PrecisionPolicyName(program.precision);
  if (program.mesh.size > 1) {
    s += absl::StrCat("\nmesh=", program.mesh.axis, ":", program.mesh.size, ",shardings=");
    first = true;
    for (const auto& [name, sharding] : program.shardings) {  // a std::map: sorted
      s += absl::StrCat(first ? "" : ",", name, "=", sharding.ToString());
      first = false;
    }
  }
  return s + "\n";
}

std::string ComputeCacheKey(const std::string& canonical_ir, const std::string& compiler_version,
                            const std::string& canonical_options, const std::string& backend_key) {
  internal::Sha256 h;
  auto field = [&h](const std::string& name, const std::string& value) {
    h.Update(absl::StrCat(name, " ", value.size(), "\n"));
    h.Update(value);
    h.Update("\n");
  };
  field("kiln-compile-cache-key", "1");
  field("ir", canonical_ir);
  field("compiler_version", compiler_version);
  field("options", canonical_options);
  field("backend", backend_key);
  return internal::DigestHex(h.Finish());
}

std::string ShapeSignature(const ir::Graph& graph) {
  std::string s;
  for (const auto& [name, type] : ParamTypes(graph))
    s += (s.empty() ? "" : ", ") + name + ":" + type;
  return s;
}

// ---------------------------------------------------------------------------------------------
// CompileCache

CompileCache::CompileCache(CompileCacheOptions options)
    : options_(std::move(options)), env_(options_.env ? options_.env : Env::Default()) {
  if (options_.use_disk && !options_.dir.empty()) disk_dir_ = JoinPath(options_.dir, "compile");
}

void CompileCache::Log(const std::string& message) const {
  if (options_.log)
    options_.log(message);
  else  // "kiln compile cache: ..." logs as "kiln: compile cache: ..."
    KILN_LOG(INFO) << (message.rfind("kiln ", 0) == 0 ? message.substr(5) : message);
}

CompileCache::KeyParts CompileCache::MakeKeyParts(const ir::Graph& graph,
                                                  const CompileOptions& options,
                                                  const std::string& backend_key) const {
  KeyParts p;
  ir::Graph anonymous = graph;
  anonymous.set_name("_");
  p.ir_text = ir::PrintGraph(anonymous);
  p.ir_hash = internal::Sha256Hex(p.ir_text);
  p.options = CanonicalOptionsString(options);
  p.backend = backend_key;
  p.signature = ShapeSignature(graph);
  return p;
}

std::string CompileCache::KeyOf(const KeyParts& parts) {
  return ComputeCacheKey(parts.ir_text, kCompilerVersion, parts.options, parts.backend);
}

std::string CompileCache::Key(const ir::Graph& graph, const CompileOptions& options,
                              const std::string& backend_key) const {
  return KeyOf(MakeKeyParts(graph, options, backend_key));
}

std::string CompileCache::EntryPath(const std::string& key) const {
  if (disk_dir_.empty()) return "";
  return JoinPath(disk_dir_, key + kEntrySuffix);
}

CacheStats CompileCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return totals_;
}

void CompileCache::ClearMemory() {
  std::lock_guard<std::mutex> lock(mu_);
  lru_.clear();
  index_.clear();
}

void CompileCache::InsertMemory(const std::string& key, const ir::Graph& graph,
                                double optimize_seconds) {
  if (options_.memory_capacity <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = index_.find(key); it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  lru_.push_front(MemEntry{key, graph, optimize_seconds});
  index_[key] = lru_.begin();
  while (static_cast<int>(lru_.size()) > options_.memory_capacity) {
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
}

std::string CompileCache::NoteSignature(const std::string& name, const KeyParts& parts,
                                        CacheStats* delta) {
  // Called with mu_ held, before history_[name].last is updated.
  NameHistory& h = history_[name];
  for (const std::string& s : h.signatures)
    if (s == parts.signature) return "";
  std::string previous = h.last.signature;
  h.signatures.push_back(parts.signature);
  int n = static_cast<int>(h.signatures.size());
  if (options_.recompile_warning_threshold > 0 && n >= options_.recompile_warning_threshold) {
    ++delta->recompile_warnings;
    return (absl::StrCat(
        "kiln compile cache: WARNING: graph '", name, "' recompiled for its ", n,
        " distinct input shapes (changed: ", DescribeShapeChange(previous, parts.signature),
        "). Every new shape is a full compile: pad or bucket the varying dimension "
        "(e.g. a fixed batch size with drop_remainder) to reuse compiled programs."));
  }
  return "";
}

std::string CompileCache::NoteMissAndExplain(const std::string& name, const KeyParts& parts,
                                             std::string* warning, CacheStats* delta) {
  // Called with mu_ held.
  auto it = history_.find(name);
  std::string why;
  if (it == history_.end() || it->second.last.ir_hash.empty()) {
    why = "new key: first compile of this graph in this process";
  } else {
    const KeyParts& last = it->second.last;
    std::vector<std::string> changed;
    if (last.signature != parts.signature)
      changed.push_back("input shapes changed (" +
                        DescribeShapeChange(last.signature, parts.signature) + ")");
    else if (last.ir_hash != parts.ir_hash)
      changed.push_back("IR changed");
    if (last.options != parts.options)
      changed.push_back("options changed (" + DescribeOptionsChange(last.options, parts.options) +
                        ")");
    if (last.backend != parts.backend)
      changed.push_back("backend changed ('" + last.backend + "' -> '" + parts.backend + "')");
    if (changed.empty()) {
      why = options_.memory_capacity > 0 ? "key seen before in this process but evicted from memory"
                                         : "memory tier disabled";
    } else {
      why = "new key: ";
      for (size_t i = 0; i < changed.size(); ++i) why += (i ? ", " : "") + changed[i];
    }
  }
  *warning = NoteSignature(name, parts, delta);
  history_[name].last = parts;
  return why;
}

bool CompileCache::ReadDisk(const std::string& key, const ir::Graph& input, ir::Graph* graph,
                            double* optimize_seconds, std::string* why, CacheStats* delta) {
  if (disk_dir_.empty()) {
    *why = "no disk tier";
    return false;
  }
  const std::string path = EntryPath(key);
  if (!env_->FileExists(path)) {
    *why = "no entry on disk";
    return false;
  }
  auto corrupt = [&](const std::string& what) {
    ++delta->corrupt_entries;
    *why = "entry corrupt: " + what + " in " + path + "; it will be rewritten";
    return false;
  };
  absl::StatusOr<std::string> bytes = ReadFileToString(env_, path);
  if (!bytes.ok()) {
    *why = "entry unreadable: " + bytes.status().ToString();
    return false;
  }
  const std::string& b = *bytes;
  if (b.size() < kHeaderBytes) return corrupt("truncated header");
  if (std::memcmp(b.data(), kMagic, 8) != 0) return corrupt("bad magic");
  if (crc32c::Unmask(GetU32(b, 76)) != crc32c::Value(b.data(), 76))
    return corrupt("crc mismatch (header)");
  if (uint32_t v = GetU32(b, 8); v != kEntryVersion)
    return corrupt(absl::StrCat("unsupported entry version ", v));
  if (b.compare(16, 32, HexToBytes(key)) != 0) return corrupt("key mismatch");
  uint64_t micros = GetU64(b, 48), d = GetU64(b, 56), p = GetU64(b, 64);
  if (d > b.size() || p > b.size() || kHeaderBytes + d + p != b.size())
    return corrupt(absl::StrCat("size mismatch (file ", b.size(), " bytes, header says ",
                                kHeaderBytes + d + p, ")"));
  if (crc32c::Unmask(GetU32(b, 72)) != crc32c::Value(b.data() + kHeaderBytes, d + p))
    return corrupt("crc mismatch (body)");
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(std::string_view(b).substr(kHeaderBytes + d, p));
  if (!g.ok()) return corrupt("program does not parse: " + g.status().ToString());
  if (!SameInterface(input, *g))
    return corrupt("program's parameters or outputs differ from the input's");
  *graph = std::move(*g);
  *optimize_seconds = static_cast<double>(micros) / 1e6;
  return true;
}

void CompileCache::WriteDisk(const std::string& key, const KeyParts& parts,
                             const std::string& graph_name, const ir::Graph& optimized,
                             double optimize_seconds, CacheStats* delta) {
  if (disk_dir_.empty()) return;
  std::string description = absl::StrCat(
      "graph: ", graph_name, "\ncompiler_version: ", kCompilerVersion, "\nbackend: ", parts.backend,
      "\ninputs: ", parts.signature, "\nir_sha256: ", parts.ir_hash, "\noptions:\n", parts.options);
  std::string program = ir::PrintGraph(optimized);
  std::string entry(kHeaderBytes, '\0');
  std::memcpy(entry.data(), kMagic, 8);
  PutU32(entry, 8, kEntryVersion);
  PutU32(entry, 12, 0);
  std::string raw_key = HexToBytes(key);
  std::memcpy(entry.data() + 16, raw_key.data(), 32);
  PutU64(entry, 48, static_cast<uint64_t>(optimize_seconds * 1e6 + 0.5));
  PutU64(entry, 56, description.size());
  PutU64(entry, 64, program.size());
  uint32_t body_crc = crc32c::Value(description.data(), description.size());
  body_crc = crc32c::Extend(body_crc, program.data(), program.size());
  PutU32(entry, 72, crc32c::Mask(body_crc));
  PutU32(entry, 76, crc32c::Mask(crc32c::Value(entry.data(), 76)));
  entry += description;
  entry += program;

  const std::string path = EntryPath(key);
  const std::string tmp = absl::StrFormat("%s.tmp.%016x", path, env_->RandomU64());
  absl::Status s = env_->CreateDir(disk_dir_);
  if (s.ok()) s = WriteStringToFile(env_, entry, tmp, /*sync=*/false);
  if (s.ok()) s = env_->RenameFile(tmp, path);
  if (!s.ok()) {
    ++delta->disk_write_errors;
    if (env_->FileExists(tmp)) (void)env_->DeleteFile(tmp);
    Log("kiln compile cache: cannot store entry for graph '" + graph_name + "': " + s.ToString());
  }
}

absl::StatusOr<ir::Graph> CompileCache::GetOrOptimize(const ir::Graph& graph,
                                                      const CompileOptions& options,
                                                      const std::string& backend_key,
                                                      CacheStats* stats) {
  // A typo in disabled_passes is an error whether or not the entry is cached, not a silent hit on
  // a program that ran every pass.
  KILN_RETURN_IF_ERROR(DefaultPipeline(options)->CheckDisabledPasses());
  auto t0 = std::chrono::steady_clock::now();
  CacheStats delta;
  KeyParts parts = MakeKeyParts(graph, options, backend_key);
  const std::string key = KeyOf(parts);
  const std::string& name = graph.name();
  auto finish = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    totals_.Add(delta);
    if (stats) stats->Add(delta);
  };

  // A caller that asked for IR dumps wants the passes to run: skip the lookup (still store).
  const bool dumps = !options.pipeline.dump_dir.empty();

  // Memory tier.
  if (!dumps) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ir::Graph out = it->second->graph;
      out.set_name(name);
      ++delta.memory_hits;
      delta.seconds_saved += it->second->optimize_seconds;
      std::string warning = NoteSignature(name, parts, &delta);
      history_[name].last = parts;
      delta.seconds_lookup += SecondsSince(t0);
      totals_.Add(delta);
      if (stats) stats->Add(delta);
      if (!warning.empty()) Log(warning);
      return out;
    }
  }

  // Disk tier.
  ir::Graph from_disk;
  double stored_seconds = 0;
  std::string disk_why;
  if (dumps) {
    disk_why = "lookup skipped: IR dumps requested";
  } else if (ReadDisk(key, graph, &from_disk, &stored_seconds, &disk_why, &delta)) {
    from_disk.set_name(name);
    ++delta.disk_hits;
    delta.seconds_saved += stored_seconds;
    std::string warning;
    {
      std::lock_guard<std::mutex> lock(mu_);
      warning = NoteSignature(name, parts, &delta);
      history_[name].last = parts;
    }
    if (!warning.empty()) Log(warning);
    InsertMemory(key, from_disk, stored_seconds);
    delta.seconds_lookup += SecondsSince(t0);
    finish();
    return from_disk;
  }
  delta.seconds_lookup += SecondsSince(t0);

  // Miss.
  ++delta.misses;
  std::string why, warning;
  {
    std::lock_guard<std::mutex> lock(mu_);
    why = NoteMissAndExplain(name, parts, &warning, &delta);
  }
  Log("kiln compile cache: miss for graph '" + name + "' (" + why + "; " + disk_why + ")");
  if (!warning.empty()) Log(warning);
  auto t1 = std::chrono::steady_clock::now();
  absl::StatusOr<ir::Graph> optimized = Optimize(graph, options);
  double seconds = SecondsSince(t1);
  delta.seconds_optimizing += seconds;
  if (!optimized.ok()) {
    finish();
    return optimized.status();
  }
  InsertMemory(key, *optimized, seconds);
  WriteDisk(key, parts, name, *optimized, seconds, &delta);
  finish();
  return optimized;
}

}  // namespace kiln::compiler
