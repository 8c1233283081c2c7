#include "kiln/compiler/artifact.h"

#include <algorithm>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/crc32c.h"
#include "kiln/base/status.h"
#include "kiln/compiler/internal/sha256.h"
#include "kiln/compiler/version.h"
#include "kiln/ir/parser.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/verifier.h"
#include "kiln/tensor/safetensors.h"
#include "nlohmann/json.hpp"

namespace kiln::compiler {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kManifest[] = "manifest.json";
constexpr char kProgram[] = "program.ir";
constexpr char kWeights[] = "weights.safetensors";

std::string SpecString(const TensorSpec& s) {
  return absl::StrCat(s.name, ": ", std::string(DTypeName(s.dtype)), s.shape.ToString());
}

Json SpecJson(const TensorSpec& s) {
  Json j = Json::object();
  j["name"] = s.name;
  j["dtype"] = std::string(DTypeName(s.dtype));
  j["shape"] = s.shape.dims();
  return j;
}

Json FileJson(const std::string& bytes, bool with_sha256) {
  Json j = Json::object();
  j["bytes"] = static_cast<uint64_t>(bytes.size());
  j["crc32c"] = crc32c::Value(bytes.data(), bytes.size());
  if (with_sha256) j["sha256"] = internal::Sha256Hex(bytes);
  return j;
}

// Throws nlohmann exceptions on a malformed spec; LoadArtifact converts them.
TensorSpec ParseSpec(const nlohmann::json& j) {
  TensorSpec s;
  s.name = j.at("name").get<std::string>();
  std::string dt = j.at("dtype").get<std::string>();
  std::optional<DType> d = DTypeFromName(dt);
  if (!d) throw std::invalid_argument("unknown dtype '" + dt + "' for '" + s.name + "'");
  s.dtype = *d;
  std::vector<int64_t> dims = j.at("shape").get<std::vector<int64_t>>();
  for (int64_t v : dims)
    if (v < 0) throw std::invalid_argument("negative dimension in shape of '" + s.name + "'");
  s.shape = Shape(std::move(dims));
  return s;
}

absl::Status CheckFile(const std::string& path, const std::string& bytes, const nlohmann::json& f,
                       bool with_sha256) {
  uint64_t want_bytes = f.at("bytes").get<uint64_t>();
  if (bytes.size() != want_bytes)
    return absl::DataLossError(
        absl::StrCat(path, ": ", bytes.size(), " bytes, the manifest says ", want_bytes));
  uint32_t want_crc = f.at("crc32c").get<uint32_t>();
  uint32_t crc = crc32c::Value(bytes.data(), bytes.size());
  if (crc != want_crc)
    return absl::DataLossError(
        absl::StrFormat("%s: crc32c 0x%08x, the manifest says 0x%08x", path, crc, want_crc));
  if (with_sha256) {
    std::string want = f.at("sha256").get<std::string>();
    std::string got = internal::Sha256Hex(bytes);
    if (got != want)
      return absl::DataLossError(
          absl::StrCat(path, ": sha256 ", got, ", the manifest says ", want));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadArtifactFile(Env* env, const std::string& dir,
                                             const std::string& name) {
  std::string path = JoinPath(dir, name);
  if (!env->FileExists(path))
    return absl::NotFoundError(absl::StrCat("artifact ", dir, ": missing ", name));
  absl::StatusOr<std::string> s = ReadFileToString(env, path);
  if (!s.ok()) return Annotate(s.status(), "artifact " + dir);
  return s;
}

}  // namespace

std::vector<TensorSpec> ArtifactSignature::RuntimeInputs() const {
  std::vector<TensorSpec> out;
  for (const InputSpec& in : inputs)
    if (!in.weight) out.push_back(in);
  return out;
}

ArtifactSignature SignatureOf(const ir::Graph& program,
                              const std::vector<std::string>& weight_names) {
  std::set<std::string> weights(weight_names.begin(), weight_names.end());
  ArtifactSignature sig;
  for (int id : program.parameters()) {
    const ir::Node& n = program.node(id);
    InputSpec in;
    in.name = n.has_attr("name") ? n.attr_str("name") : "";
    in.dtype = n.type().dtype;
    in.shape = n.type().shape;
    in.weight = weights.count(in.name) > 0;
    sig.inputs.push_back(std::move(in));
  }
  for (const ir::Output& o : program.outputs()) {
    const ir::Type& t = program.node(o.node).type();
    sig.outputs.push_back(TensorSpec{o.name, t.dtype, t.shape});
  }
  return sig;
}

absl::StatusOr<std::vector<Tensor>> Artifact::BindInputs(
    const std::map<std::string, Tensor>& inputs) const {
  std::set<std::string> used;
  std::vector<Tensor> args;
  for (const InputSpec& in : signature.inputs) {
    const Tensor* t = nullptr;
    if (in.weight) {
      auto it = weights.find(in.name);
      if (it == weights.end())
        return absl::InternalError("artifact has no weight '" + in.name + "'");
      t = &it->second;
      if (inputs.count(in.name))
        return absl::InvalidArgumentError("input '" + in.name +
                                          "' is a weight stored in the artifact; do not pass it");
    } else {
      auto it = inputs.find(in.name);
      if (it == inputs.end())
        return absl::InvalidArgumentError("missing input '" + SpecString(in) + "'");
      t = &it->second;
      used.insert(in.name);
    }
    if (t->dtype() != in.dtype || t->shape() != in.shape)
      return absl::InvalidArgumentError(
          absl::StrCat("input '", in.name, "' is ", t->TypeString(), ", the signature says ",
                       std::string(DTypeName(in.dtype)), in.shape.ToString()));
    args.push_back(*t);
  }
  for (const auto& [name, t] : inputs)
    if (!used.count(name) && !weights.count(name))
      return absl::InvalidArgumentError("unknown input '" + name + "' (not in the signature)");
  return args;
}

absl::Status WriteArtifact(const std::string& dir, const ir::Graph& program,
                           const std::map<std::string, Tensor>& weights,
                           const ArtifactOptions& options, Env* env) {
  if (env == nullptr) env = Env::Default();
  KILN_RETURN_IF_ERROR(Annotate(ir::Verify(program), "WriteArtifact: invalid program"));
  std::vector<std::string> weight_names;
  for (const auto& [name, t] : weights) {
    int id = program.FindParameter(name);
    if (id < 0)
      return absl::InvalidArgumentError("WriteArtifact: weight '" + name +
                                        "' is not a parameter of graph '" + program.name() + "'");
    const ir::Type& type = program.node(id).type();
    if (t.dtype() != type.dtype || t.shape() != type.shape)
      return absl::InvalidArgumentError(absl::StrCat("WriteArtifact: weight '", name, "' is ",
                                                     t.TypeString(), ", parameter is ",
                                                     type.ToString()));
    weight_names.push_back(name);
  }
  ArtifactSignature sig = SignatureOf(program, weight_names);
  std::set<std::string> names;
  for (const InputSpec& in : sig.inputs)
    if (in.name.empty() || !names.insert(in.name).second)
      return absl::InvalidArgumentError("WriteArtifact: parameters need unique, non-empty names");

  // Files.
  std::string program_text = ir::PrintGraph(program);
  std::vector<std::pair<std::string, Tensor>> ordered;
  for (const InputSpec& in : sig.inputs)
    if (in.weight) ordered.emplace_back(in.name, weights.at(in.name));
  KILN_ASSIGN_OR_RETURN(std::string weight_bytes,
                        SerializeSafetensors(ordered, {{"format", "kiln.artifact.weights"}}));

  Json m = Json::object();
  m["format"] = kArtifactFormat;
  m["version"] = kArtifactVersion;
  m["name"] = program.name();
  m["compiler_version"] = kCompilerVersion;
  m["backend"] = options.backend;
  Json files = Json::object();
  files[kProgram] = FileJson(program_text, /*with_sha256=*/true);
  files[kWeights] = FileJson(weight_bytes, /*with_sha256=*/false);
  m["files"] = files;
  Json inputs = Json::array(), outputs = Json::array();
  for (const InputSpec& in : sig.inputs) {
    Json j = SpecJson(in);
    j["weight"] = in.weight;
    inputs.push_back(j);
  }
  for (const TensorSpec& o : sig.outputs) outputs.push_back(SpecJson(o));
  Json sj = Json::object();
  sj["inputs"] = inputs;
  sj["outputs"] = outputs;
  m["signature"] = sj;
  Json meta = Json::object();
  for (const auto& [k, v] : options.metadata) meta[k] = v;
  m["metadata"] = meta;
  std::string manifest;
  try {
    manifest = m.dump(2) + "\n";
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(std::string("WriteArtifact: manifest: ") + e.what());
  }

  // Write into a temporary sibling, manifest last, then rename into place.
  const std::string clean = CleanPath(dir);
  if (env->FileExists(clean) && !options.overwrite)
    return absl::AlreadyExistsError("WriteArtifact: " + clean +
                                    " exists (set ArtifactOptions::overwrite to replace it)");
  const std::string tmp = absl::StrFormat("%s.tmp-%016x", clean, env->RandomU64());
  auto write_all = [&]() -> absl::Status {
    KILN_RETURN_IF_ERROR(env->CreateDir(tmp));
    KILN_RETURN_IF_ERROR(WriteStringToFile(env, program_text, JoinPath(tmp, kProgram), true));
    KILN_RETURN_IF_ERROR(WriteStringToFile(env, weight_bytes, JoinPath(tmp, kWeights), true));
    KILN_RETURN_IF_ERROR(WriteStringToFile(env, manifest, JoinPath(tmp, kManifest), true));
    KILN_RETURN_IF_ERROR(env->SyncDir(tmp));
    if (env->FileExists(clean)) {
      const std::string old = absl::StrFormat("%s.old-%016x", clean, env->RandomU64());
      KILN_RETURN_IF_ERROR(env->RenameFile(clean, old));
      KILN_RETURN_IF_ERROR(env->RenameFile(tmp, clean));
      KILN_RETURN_IF_ERROR(env->DeleteDir(old));
    } else {
      KILN_RETURN_IF_ERROR(env->RenameFile(tmp, clean));
    }
    return env->SyncDir(Dirname(clean).empty() ? "." : Dirname(clean));
  };
  absl::Status s = write_all();
  if (!s.ok()) {
    if (env->FileExists(tmp)) (void)env->DeleteDir(tmp);
    return Annotate(s, "WriteArtifact " + clean);
  }
  return absl::OkStatus();
}

absl::StatusOr<Artifact> LoadArtifact(const std::string& dir, Env* env) {
  if (env == nullptr) env = Env::Default();
  const std::string where = "artifact " + dir;
  KILN_ASSIGN_OR_RETURN(std::string manifest_text, ReadArtifactFile(env, dir, kManifest));
  nlohmann::json m = nlohmann::json::parse(manifest_text, nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded() || !m.is_object())
    return absl::DataLossError(where + ": manifest.json is not a JSON object");

  Artifact a;
  std::vector<std::string> weight_names;
  std::vector<InputSpec> declared_inputs;
  std::vector<TensorSpec> declared_outputs;
  std::string program_text, weight_bytes;
  try {
    if (!m.contains("format") || m.at("format") != kArtifactFormat)
      return absl::InvalidArgumentError(where + ": manifest.json: format is not \"" +
                                        std::string(kArtifactFormat) + "\"");
    int version = m.at("version").get<int>();
    if (version != kArtifactVersion)
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": version ", version, " is not supported (this kiln reads version ",
                       kArtifactVersion, ")"));
    a.compiler_version = m.at("compiler_version").get<std::string>();
    a.backend = m.value("backend", std::string());
    if (m.contains("metadata"))
      a.metadata = m.at("metadata").get<std::map<std::string, std::string>>();
    const nlohmann::json& files = m.at("files");

    KILN_ASSIGN_OR_RETURN(program_text, ReadArtifactFile(env, dir, kProgram));
    KILN_RETURN_IF_ERROR(CheckFile(JoinPath(dir, kProgram), program_text, files.at(kProgram),
                                   /*with_sha256=*/true));
    a.program_sha256 = files.at(kProgram).at("sha256").get<std::string>();
    KILN_ASSIGN_OR_RETURN(weight_bytes, ReadArtifactFile(env, dir, kWeights));
    KILN_RETURN_IF_ERROR(CheckFile(JoinPath(dir, kWeights), weight_bytes, files.at(kWeights),
                                   /*with_sha256=*/false));

    const nlohmann::json& sig = m.at("signature");
    for (const nlohmann::json& j : sig.at("inputs")) {
      InputSpec in;
      static_cast<TensorSpec&>(in) = ParseSpec(j);
      in.weight = j.at("weight").get<bool>();
      if (in.weight) weight_names.push_back(in.name);
      declared_inputs.push_back(std::move(in));
    }
    for (const nlohmann::json& j : sig.at("outputs")) declared_outputs.push_back(ParseSpec(j));
  } catch (const std::exception& e) {
    return absl::DataLossError(where + ": malformed manifest.json: " + e.what());
  }

  // The program.
  absl::StatusOr<ir::Graph> program = ir::ParseGraph(program_text);
  if (!program.ok())
    return absl::DataLossError(where + ": program.ir: " + program.status().ToString());
  a.program = std::move(*program);

  // The signature against the program.
  a.signature = SignatureOf(a.program, weight_names);
  const ArtifactSignature& s = a.signature;
  if (s.inputs.size() != declared_inputs.size())
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the manifest lists ", declared_inputs.size(),
                     " inputs, the program has ", s.inputs.size(), " parameters"));
  for (size_t i = 0; i < s.inputs.size(); ++i)
    if (!(static_cast<const TensorSpec&>(s.inputs[i]) == declared_inputs[i]) ||
        s.inputs[i].weight != declared_inputs[i].weight)
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": input ", i, " is '", SpecString(declared_inputs[i]),
                       "' in the manifest, '", SpecString(s.inputs[i]), "' in the program"));
  if (s.outputs.size() != declared_outputs.size())
    return absl::InvalidArgumentError(absl::StrCat(where, ": the manifest lists ",
                                                   declared_outputs.size(),
                                                   " outputs, the program has ", s.outputs.size()));
  for (size_t i = 0; i < s.outputs.size(); ++i)
    if (!(s.outputs[i] == declared_outputs[i]))
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": output ", i, " is '", SpecString(declared_outputs[i]),
                       "' in the manifest, '", SpecString(s.outputs[i]), "' in the program"));

  // The weights.
  absl::StatusOr<std::map<std::string, Tensor>> weights =
      ParseSafetensors(weight_bytes, nullptr, JoinPath(dir, kWeights));
  if (!weights.ok()) return weights.status();
  for (const InputSpec& in : s.inputs) {
    if (!in.weight) continue;
    auto it = weights->find(in.name);
    if (it == weights->end())
      return absl::DataLossError(where + ": weights.safetensors lacks weight '" + in.name + "'");
    if (it->second.dtype() != in.dtype || it->second.shape() != in.shape)
      return absl::DataLossError(absl::StrCat(
          where, ": weight '", in.name, "' is ", it->second.TypeString(), ", the signature says ",
          std::string(DTypeName(in.dtype)), in.shape.ToString()));
  }
  if (weights->size() != weight_names.size()) {
    for (const auto& [name, t] : *weights)
      if (std::find(weight_names.begin(), weight_names.end(), name) == weight_names.end())
        return absl::DataLossError(where + ": weights.safetensors has '" + name +
                                   "', which is not a weight input");
  }
  a.weights = std::move(*weights);
  return a;
}

}  // namespace kiln::compiler
