#include "kiln/serve/grpc_convert.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kiln::serve {
namespace {

using inference::InferParameter;
using inference::InferTensorContents;

absl::Status Bad(const std::string& field, std::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", std::string(message)));
}

// The typed field that holds `dt`'s values, as the protocol assigns them.
const char* TypedField(DType dt) {
  switch (dt) {
    case DType::kF32:
      return "fp32_contents";
    case DType::kF64:
      return "fp64_contents";
    case DType::kS8:
    case DType::kS32:
      return "int_contents";
    case DType::kU8:
      return "uint_contents";
    case DType::kS64:
      return "int64_contents";
    case DType::kBool:
      return "bool_contents";
    default:
      return nullptr;  // FP16, BF16: raw only
  }
}

// How many values each typed field holds, by name.
std::vector<std::pair<const char*, int>> FieldSizes(const InferTensorContents& c) {
  return {
      {"bool_contents", c.bool_contents_size()},     {"int_contents", c.int_contents_size()},
      {"int64_contents", c.int64_contents_size()},   {"uint_contents", c.uint_contents_size()},
      {"uint64_contents", c.uint64_contents_size()}, {"fp32_contents", c.fp32_contents_size()},
      {"fp64_contents", c.fp64_contents_size()},     {"bytes_contents", c.bytes_contents_size()}};
}

// Copies the typed contents `c` into `t` (the datatype's field, exactly n values).
absl::Status FillTyped(const InferTensorContents& c, const std::string& at, Tensor& t) {
  const DType dt = t.dtype();
  const char* field = TypedField(dt);
  if (field == nullptr) {
    return Bad(at, absl::StrCat(OipDatatype(dt),
                                " has no typed contents: send its bytes in raw_input_contents"));
  }
  int given = 0;
  for (const auto& [name, size] : FieldSizes(c)) {
    if (std::strcmp(name, field) == 0) {
      given = size;
    } else if (size > 0) {
      return Bad(at, absl::StrCat(name, " given for ", OipDatatype(dt), " (its values go in ",
                                  field, ")"));
    }
  }
  const int64_t n = t.num_elements();
  if (given != n) {
    return Bad(absl::StrCat(at, ".", field),
               absl::StrCat(given, " values, but shape ", t.shape().ToString(), " needs ", n));
  }
  if (n == 0) return absl::OkStatus();
  auto store_int = [&](int64_t i, int64_t v) -> absl::Status {
    auto [lo, hi] = IntegerRange(dt);
    if (v < lo || v > hi) {
      return Bad(absl::StrCat(at, ".", field),
                 absl::StrCat("element ", i, " (", v, ") is outside [", lo, ", ", hi, "] of ",
                              OipDatatype(dt)));
    }
    StoreFromInt64(t.raw_data(), dt, i, v);
    return absl::OkStatus();
  };
  switch (dt) {
    case DType::kF32:
      std::memcpy(t.raw_data(), c.fp32_contents().data(), n * sizeof(float));
      break;
    case DType::kF64:
      std::memcpy(t.raw_data(), c.fp64_contents().data(), n * sizeof(double));
      break;
    case DType::kS64:
      std::memcpy(t.raw_data(), c.int64_contents().data(), n * sizeof(int64_t));
      break;
    case DType::kBool:
      for (int64_t i = 0; i < n; ++i) StoreFromInt64(t.raw_data(), dt, i, c.bool_contents(i));
      break;
    case DType::kS8:
    case DType::kS32:
      for (int64_t i = 0; i < n; ++i) {
        absl::Status s = store_int(i, c.int_contents(i));
        if (!s.ok()) return s;
      }
      break;
    case DType::kU8:
      for (int64_t i = 0; i < n; ++i) {
        absl::Status s = store_int(i, c.uint_contents(i));
        if (!s.ok()) return s;
      }
      break;
    default:
      return absl::InternalError(absl::StrCat(at, ": no typed path for ", OipDatatype(dt)));
  }
  return absl::OkStatus();
}

// parameters.<key> as a non-negative integer.
absl::Status ReadCount(const InferParameter& p, const std::string& field, int64_t* out) {
  if (p.parameter_choice_case() == InferParameter::kInt64Param) {
    if (p.int64_param() < 0) return Bad(field, "is negative");
    *out = p.int64_param();
    return absl::OkStatus();
  }
  if (p.parameter_choice_case() == InferParameter::kUint64Param) {
    if (p.uint64_param() > static_cast<uint64_t>(INT64_MAX)) return Bad(field, "is too large");
    *out = static_cast<int64_t>(p.uint64_param());
    return absl::OkStatus();
  }
  return Bad(field, "expected an int64_param or uint64_param");
}

// Appends `t`'s values to the typed field of its datatype.
void AppendTyped(const Tensor& t, InferTensorContents* c) {
  const int64_t n = t.num_elements();
  switch (t.dtype()) {
    case DType::kF32: {
      const float* v = t.data<float>();
      c->mutable_fp32_contents()->Add(v, v + n);
      break;
    }
    case DType::kF64: {
      const double* v = t.data<double>();
      c->mutable_fp64_contents()->Add(v, v + n);
      break;
    }
    case DType::kS64: {
      const int64_t* v = t.data<int64_t>();
      c->mutable_int64_contents()->Add(v, v + n);
      break;
    }
    case DType::kS8:
    case DType::kS32:
      for (int64_t i = 0; i < n; ++i)
        c->add_int_contents(static_cast<int32_t>(LoadAsInt64(t.raw_data(), t.dtype(), i)));
      break;
    case DType::kU8:
      for (int64_t i = 0; i < n; ++i)
        c->add_uint_contents(static_cast<uint32_t>(LoadAsInt64(t.raw_data(), t.dtype(), i)));
      break;
    case DType::kBool:
      for (int64_t i = 0; i < n; ++i)
        c->add_bool_contents(LoadAsInt64(t.raw_data(), t.dtype(), i) != 0);
      break;
    default:
      break;  // never asked: such outputs make the whole answer raw
  }
}

}  // namespace

absl::StatusOr<InferBody> InferBodyFromProto(const inference::ModelInferRequest& req,
                                             int64_t max_elements, bool* raw_outputs) {
  InferBody b;
  b.id = req.id();
  b.has_id = !req.id().empty();
  *raw_outputs = req.raw_input_contents_size() > 0;
  for (const auto& [key, p] : req.parameters()) {
    const std::string field = absl::StrCat("parameters.", key);
    absl::Status s;
    if (key == "priority") {
      s = ReadCount(p, field, &b.priority);
    } else if (key == "timeout") {
      s = ReadCount(p, field, &b.timeout_us);
    } else if (key == "binary_data_output") {
      if (p.parameter_choice_case() != InferParameter::kBoolParam)
        return Bad(field, "expected a bool_param");
      if (p.bool_param()) *raw_outputs = true;
    }
    if (!s.ok()) return s;
  }
  const bool raw = req.raw_input_contents_size() > 0;
  if (raw && req.raw_input_contents_size() != req.inputs_size()) {
    return Bad("raw_input_contents", absl::StrCat(req.raw_input_contents_size(), " entries for ",
                                                  req.inputs_size(), " inputs (one per input)"));
  }
  if (req.inputs_size() == 0) return Bad("inputs", "missing");
  for (int i = 0; i < req.inputs_size(); ++i) {
    const auto& in = req.inputs(i);
    const std::string at = absl::StrCat("inputs[", i, "]");
    if (in.name().empty()) return Bad(at + ".name", "missing");
    DType dt;
    if (!ParseOipDatatype(in.datatype(), &dt)) {
      return Bad(at + ".datatype",
                 absl::StrCat("'", in.datatype(),
                              "' is not one of FP32 FP16 BF16 FP64 INT8 UINT8 INT32 INT64 BOOL"));
    }
    std::vector<int64_t> dims;
    int64_t n = 1;
    for (int d = 0; d < in.shape_size(); ++d) {
      const int64_t v = in.shape(d);
      if (v < 0) return NegativeDimension(absl::StrCat(at, ".shape[", d, "]"), v);
      if (v != 0 && n > max_elements / v)
        n = max_elements + 1;  // no overflow
      else
        n *= v;
      dims.push_back(v);
    }
    if (n > max_elements) {
      return absl::ResourceExhaustedError(
          absl::StrCat(at, ".shape: more than ", max_elements, " elements"));
    }
    InferInput input;
    input.name = in.name();
    input.tensor = Tensor(dt, Shape(dims));
    if (raw) {
      if (in.has_contents()) return Bad(at + ".contents", "given together with raw_input_contents");
      const std::string& bytes = req.raw_input_contents(i);
      const int64_t want = input.tensor.byte_size();
      if (static_cast<int64_t>(bytes.size()) != want) {
        return Bad(absl::StrCat("raw_input_contents[", i, "]"),
                   absl::StrCat(bytes.size(), " bytes, but ", in.datatype(), " of shape ",
                                input.tensor.shape().ToString(), " is ", want, " bytes"));
      }
      if (want > 0) std::memcpy(input.tensor.raw_data(), bytes.data(), want);
    } else {
      if (!in.has_contents() && n > 0)
        return Bad(at + ".contents", "missing (and no raw_input_contents)");
      absl::Status s = FillTyped(in.contents(), at + ".contents", input.tensor);
      if (!s.ok()) return s;
    }
    b.elements += n;
    b.inputs.push_back(std::move(input));
  }
  for (int i = 0; i < req.outputs_size(); ++i) {
    if (req.outputs(i).name().empty()) return Bad(absl::StrCat("outputs[", i, "].name"), "missing");
    RequestedOutput r;
    r.name = req.outputs(i).name();
    b.outputs.push_back(std::move(r));
  }
  return b;
}

void FillInferResponse(const std::string& model, const std::string& version, const std::string& id,
                       const std::vector<InferOutput>& outputs, bool raw_outputs,
                       inference::ModelInferResponse* response) {
  response->set_model_name(model);
  response->set_model_version(version);
  if (!id.empty()) response->set_id(id);
  bool raw = raw_outputs;
  for (const InferOutput& o : outputs) raw = raw || TypedField(o.tensor.dtype()) == nullptr;
  for (const InferOutput& o : outputs) {
    auto* out = response->add_outputs();
    out->set_name(o.name);
    out->set_datatype(OipDatatype(o.tensor.dtype()));
    for (int64_t d : o.tensor.shape().dims()) out->add_shape(d);
    if (raw) {
      response->add_raw_output_contents(static_cast<const char*>(o.tensor.raw_data()),
                                        o.tensor.byte_size());
    } else {
      AppendTyped(o.tensor, out->mutable_contents());
    }
  }
}

absl::StatusOr<Tensor> TensorFromOutput(const inference::ModelInferResponse& response, int index) {
  const std::string at = absl::StrCat("outputs[", index, "]");
  if (index < 0 || index >= response.outputs_size()) return Bad(at, "no such output");
  const auto& o = response.outputs(index);
  DType dt;
  if (!ParseOipDatatype(o.datatype(), &dt))
    return Bad(at + ".datatype", absl::StrCat("'", o.datatype(), "' is not known"));
  std::vector<int64_t> dims(o.shape().begin(), o.shape().end());
  for (int64_t d : dims)
    if (d < 0) return Bad(at + ".shape", "negative dimension");
  Tensor t(dt, Shape(dims));
  if (response.raw_output_contents_size() > 0) {
    if (index >= response.raw_output_contents_size())
      return Bad("raw_output_contents", "fewer entries than outputs");
    const std::string& bytes = response.raw_output_contents(index);
    if (static_cast<int64_t>(bytes.size()) != t.byte_size())
      return Bad(absl::StrCat("raw_output_contents[", index, "]"), "size does not fit the shape");
    if (t.byte_size() > 0) std::memcpy(t.raw_data(), bytes.data(), t.byte_size());
    return t;
  }
  absl::Status s = FillTyped(o.contents(), at + ".contents", t);
  if (!s.ok()) return s;
  return t;
}

}  // namespace kiln::serve
