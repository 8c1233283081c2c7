#include "kiln/serve/oip.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "simdjson.h"

namespace kiln::serve {
namespace {

namespace sj = simdjson::ondemand;

absl::Status Bad(std::string_view field, std::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(field), ": ", std::string(message)));
}

}  // namespace

absl::Status NegativeDimension(const std::string& field, int64_t value) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, " is ", value, ": dimensions must be >= 0"));
}

namespace {

struct PendingInput {
  std::string name;
  bool has_name = false;
  std::string datatype;
  bool has_datatype = false;
  std::vector<int64_t> shape;
  bool has_shape = false;
  std::string_view data;  // raw JSON of the data array
  bool has_data = false;
  int64_t binary_size = -1;
};

absl::Status ReadInt(sj::value& v, std::string_view field, int64_t* out) {
  if (v.get_int64().get(*out)) return Bad(field, "expected an integer");
  return absl::OkStatus();
}

absl::Status ReadString(sj::value& v, std::string_view field, std::string* out) {
  std::string_view s;
  if (v.get_string().get(s)) return Bad(field, "expected a string");
  *out = std::string(s);
  return absl::OkStatus();
}

absl::Status ReadBool(sj::value& v, std::string_view field, bool* out) {
  if (v.get_bool().get(*out)) return Bad(field, "expected true or false");
  return absl::OkStatus();
}

// Calls f(key, value) for every member of the object `v`.
template <typename F>
absl::Status ForEachField(sj::value& v, std::string_view field, F f) {
  sj::object obj;
  if (v.get_object().get(obj)) return Bad(field, "expected an object");
  for (auto member : obj) {
    sj::field m;
    std::string_view key;
    if (std::move(member).get(m) || m.unescaped_key().get(key))
      return Bad(field, "malformed object");
    sj::value val = m.value();
    absl::Status s = f(key, val);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

template <typename F>
absl::Status ForEachElement(sj::value& v, std::string_view field, F f) {
  sj::array arr;
  if (v.get_array().get(arr)) return Bad(field, "expected an array");
  int i = 0;
  for (auto element : arr) {
    sj::value val;
    if (std::move(element).get(val)) return Bad(field, "malformed array");
    absl::Status s = f(i++, val);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ParseInputObject(sj::value& v, const std::string& at, PendingInput* p) {
  return ForEachField(v, at, [&](std::string_view key, sj::value& val) -> absl::Status {
    const std::string field = absl::StrCat(at, ".", std::string(key));
    if (key == "name") {
      p->has_name = true;
      return ReadString(val, field, &p->name);
    }
    if (key == "datatype") {
      p->has_datatype = true;
      return ReadString(val, field, &p->datatype);
    }
    if (key == "shape") {
      p->has_shape = true;
      return ForEachElement(val, field, [&](int i, sj::value& d) -> absl::Status {
        int64_t n = 0;
        if (d.get_int64().get(n))
          return Bad(absl::StrCat(field, "[", i, "]"), "expected an integer dimension >= 0");
        if (n < 0) return NegativeDimension(absl::StrCat(field, "[", i, "]"), n);
        p->shape.push_back(n);
        return absl::OkStatus();
      });
    }
    if (key == "data") {
      sj::array arr;
      if (val.get_array().get(arr)) return Bad(field, "expected an array of values");
      std::string_view raw;
      if (arr.raw_json().get(raw)) return Bad(field, "malformed array");
      p->data = raw;
      p->has_data = true;
      return absl::OkStatus();
    }
    if (key == "parameters") {
      return ForEachField(val, field, [&](std::string_view k, sj::value& pv) -> absl::Status {
        if (k != "binary_data_size") return absl::OkStatus();
        int64_t n = 0;
        absl::Status s = ReadInt(pv, absl::StrCat(field, ".binary_data_size"), &n);
        if (s.ok() && n < 0) s = Bad(absl::StrCat(field, ".binary_data_size"), "is negative");
        p->binary_size = n;
        return s;
      });
    }
    return absl::OkStatus();  // unknown members are ignored, as the protocol allows
  });
}

// Stores value `v` as element `i` of `t`.
absl::Status StoreValue(sj::value& v, Tensor& t, int64_t i, std::string_view field) {
  const DType dt = t.dtype();
  if (dt == DType::kBool) {
    bool b = false;
    if (v.get_bool().get(b)) return Bad(field, absl::StrCat("element ", i, " is not a bool"));
    StoreFromInt64(t.raw_data(), dt, i, b ? 1 : 0);
    return absl::OkStatus();
  }
  if (IsInteger(dt)) {
    int64_t n = 0;
    if (v.get_int64().get(n)) return Bad(field, absl::StrCat("element ", i, " is not an integer"));
    auto [lo, hi] = IntegerRange(dt);
    if (n < lo || n > hi) {
      return Bad(field, absl::StrCat("element ", i, " (", n, ") is outside [", lo, ", ", hi,
                                     "] of ", OipDatatype(dt)));
    }
    StoreFromInt64(t.raw_data(), dt, i, n);
    return absl::OkStatus();
  }
  double d = 0;
  if (v.get_double().get(d)) return Bad(field, absl::StrCat("element ", i, " is not a number"));
  if (dt == DType::kF32) {
    t.data<float>()[i] = static_cast<float>(d);
  } else {
    t.SetDouble(i, d);
  }
  return absl::OkStatus();
}

absl::Status FillData(sj::array& arr, Tensor& t, int64_t* at, std::string_view field, int depth) {
  if (depth > 32) return Bad(field, "arrays nested too deeply");
  for (auto element : arr) {
    sj::value v;
    sj::json_type type;
    if (std::move(element).get(v) || v.type().get(type)) return Bad(field, "malformed array");
    if (type == sj::json_type::array) {
      sj::array sub;
      if (v.get_array().get(sub)) return Bad(field, "malformed array");
      absl::Status s = FillData(sub, t, at, field, depth + 1);
      if (!s.ok()) return s;
      continue;
    }
    if (*at >= t.num_elements())
      return Bad(field, absl::StrCat("more values than the shape's ", t.num_elements()));
    absl::Status s = StoreValue(v, t, *at, field);
    if (!s.ok()) return s;
    ++*at;
  }
  return absl::OkStatus();
}

absl::StatusOr<InferInput> FinishInput(const PendingInput& p, const std::string& at,
                                       std::string_view binary, size_t* binary_used,
                                       int64_t max_elements) {
  if (!p.has_name) return Bad(at + ".name", "missing");
  if (!p.has_datatype) return Bad(at + ".datatype", "missing");
  if (!p.has_shape) return Bad(at + ".shape", "missing");
  DType dt;
  if (!ParseOipDatatype(p.datatype, &dt)) {
    return Bad(at + ".datatype",
               absl::StrCat("'", p.datatype,
                            "' is not one of FP32 FP16 BF16 FP64 INT8 UINT8 INT32 INT64 BOOL"));
  }
  int64_t n = 1;
  for (size_t i = 0; i < p.shape.size(); ++i) {
    const int64_t d = p.shape[i];
    if (d < 0) return NegativeDimension(absl::StrCat(at, ".shape[", i, "]"), d);
    if (d != 0 && n > max_elements / d)
      return Bad(at + ".shape", absl::StrCat("more than ", max_elements, " elements"));
    n *= d;
  }
  if (n > max_elements)
    return Bad(at + ".shape", absl::StrCat("more than ", max_elements, " elements"));
  InferInput in;
  in.name = p.name;
  in.tensor = Tensor(dt, Shape(p.shape));
  if (p.binary_size >= 0) {
    if (p.has_data) return Bad(at, "has both data and parameters.binary_data_size");
    const int64_t want = n * DTypeSize(dt);
    if (p.binary_size != want) {
      return Bad(at + ".parameters.binary_data_size",
                 absl::StrCat(p.binary_size, " bytes, but ", p.datatype, " of shape ",
                              Shape(p.shape).ToString(), " is ", want, " bytes"));
    }
    if (binary.size() - *binary_used < static_cast<size_t>(want)) {
      return Bad(at + ".parameters.binary_data_size",
                 absl::StrCat(want, " bytes past the end of the body (",
                              binary.size() - *binary_used, " binary bytes left)"));
    }
    std::memcpy(in.tensor.raw_data(), binary.data() + *binary_used, want);
    *binary_used += want;
    return in;
  }
  if (!p.has_data) return Bad(at + ".data", "missing (and no parameters.binary_data_size)");
  thread_local sj::parser parser;
  simdjson::padded_string padded(p.data);
  sj::document doc;
  sj::array arr;
  if (parser.iterate(padded).get(doc) || doc.get_array().get(arr))
    return Bad(at + ".data", "malformed array");
  int64_t count = 0;
  absl::Status s = FillData(arr, in.tensor, &count, at + ".data", 0);
  if (!s.ok()) return s;
  if (count != n) {
    return Bad(at + ".data",
               absl::StrCat(count, " values, but shape ", Shape(p.shape).ToString(), " needs ", n));
  }
  return in;
}

absl::Status ParseParameters(sj::value& v, InferBody* b) {
  return ForEachField(v, "parameters", [&](std::string_view key, sj::value& val) -> absl::Status {
    if (key == "priority") {
      absl::Status s = ReadInt(val, "parameters.priority", &b->priority);
      if (s.ok() && b->priority < 0) s = Bad("parameters.priority", "is negative");
      return s;
    }
    if (key == "timeout") {
      absl::Status s = ReadInt(val, "parameters.timeout", &b->timeout_us);
      if (s.ok() && b->timeout_us < 0) s = Bad("parameters.timeout", "is negative");
      return s;
    }
    if (key == "binary_data_output")
      return ReadBool(val, "parameters.binary_data_output", &b->binary_data_output);
    return absl::OkStatus();
  });
}

absl::Status ParseOutputs(sj::value& v, InferBody* b) {
  return ForEachElement(v, "outputs", [&](int i, sj::value& o) -> absl::Status {
    const std::string at = absl::StrCat("outputs[", i, "]");
    RequestedOutput r;
    bool has_name = false;
    absl::Status s = ForEachField(o, at, [&](std::string_view key, sj::value& val) {
      if (key == "name") {
        has_name = true;
        return ReadString(val, at + ".name", &r.name);
      }
      if (key != "parameters") return absl::OkStatus();
      return ForEachField(val, at + ".parameters", [&](std::string_view k, sj::value& pv) {
        if (k != "binary_data") return absl::OkStatus();
        bool bin = false;
        absl::Status st = ReadBool(pv, at + ".parameters.binary_data", &bin);
        r.binary = bin ? 1 : 0;
        return st;
      });
    });
    if (!s.ok()) return s;
    if (!has_name) return Bad(at + ".name", "missing");
    b->outputs.push_back(std::move(r));
    return absl::OkStatus();
  });
}

}  // namespace

const char* OipDatatype(DType t) {
  switch (t) {
    case DType::kF32:
      return "FP32";
    case DType::kF16:
      return "FP16";
    case DType::kBF16:
      return "BF16";
    case DType::kF64:
      return "FP64";
    case DType::kS8:
      return "INT8";
    case DType::kU8:
      return "UINT8";
    case DType::kS32:
      return "INT32";
    case DType::kS64:
      return "INT64";
    case DType::kBool:
      return "BOOL";
    default:
      return "";
  }
}

bool ParseOipDatatype(std::string_view name, DType* t) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kS8, DType::kU8,
                  DType::kS32, DType::kS64, DType::kBool}) {
    if (name == OipDatatype(d)) {
      *t = d;
      return true;
    }
  }
  return false;
}

absl::StatusOr<InferBody> ParseInferRequest(std::string_view json, std::string_view binary,
                                            int64_t max_elements) {
  thread_local sj::parser parser;
  simdjson::padded_string padded(json);
  sj::document doc;
  sj::object obj;
  if (parser.iterate(padded).get(doc) || doc.get_object().get(obj))
    return Bad("body", "expected a JSON object");
  InferBody b;
  std::vector<PendingInput> pending;
  bool has_inputs = false;
  for (auto member : obj) {
    sj::field m;
    std::string_view key;
    if (std::move(member).get(m) || m.unescaped_key().get(key))
      return Bad("body", "malformed JSON");
    sj::value v = m.value();
    absl::Status s;
    if (key == "id") {
      b.has_id = true;
      s = ReadString(v, "id", &b.id);
    } else if (key == "parameters") {
      s = ParseParameters(v, &b);
    } else if (key == "inputs") {
      has_inputs = true;
      s = ForEachElement(v, "inputs", [&](int i, sj::value& in) {
        pending.emplace_back();
        return ParseInputObject(in, absl::StrCat("inputs[", i, "]"), &pending.back());
      });
    } else if (key == "outputs") {
      s = ParseOutputs(v, &b);
    }
    if (!s.ok()) return s;
  }
  if (!has_inputs) return Bad("inputs", "missing");
  size_t used = 0;
  for (size_t i = 0; i < pending.size(); ++i) {
    absl::StatusOr<InferInput> in =
        FinishInput(pending[i], absl::StrCat("inputs[", i, "]"), binary, &used, max_elements);
    if (!in.ok()) return in.status();
    b.elements += in->tensor.num_elements();
    b.inputs.push_back(std::move(*in));
  }
  if (used != binary.size()) {
    return Bad("binary data", absl::StrCat(binary.size() - used,
                                           " bytes after the JSON header belong to no input"));
  }
  return b;
}

absl::StatusOr<bool> ParseIndexReady(std::string_view json) {
  thread_local sj::parser parser;
  simdjson::padded_string padded(json);
  sj::document doc;
  sj::object obj;
  if (parser.iterate(padded).get(doc) || doc.get_object().get(obj))
    return Bad("body", "expected a JSON object");
  bool ready = false;
  for (auto member : obj) {
    sj::field m;
    std::string_view key;
    if (std::move(member).get(m) || m.unescaped_key().get(key))
      return Bad("body", "malformed JSON");
    if (key != "ready") continue;
    sj::value v = m.value();
    absl::Status s = ReadBool(v, "ready", &ready);
    if (!s.ok()) return s;
  }
  return ready;
}

void AppendJsonData(const Tensor& t, std::string* out) {
  out->push_back('[');
  const DType dt = t.dtype();
  const int64_t n = t.num_elements();
  char buf[32];
  for (int64_t i = 0; i < n; ++i) {
    if (i > 0) out->push_back(',');
    if (dt == DType::kBool) {
      out->append(LoadAsInt64(t.raw_data(), dt, i) ? "true" : "false");
    } else if (IsInteger(dt)) {
      auto r = std::to_chars(buf, buf + sizeof(buf), LoadAsInt64(t.raw_data(), dt, i));
      out->append(buf, r.ptr);
    } else {
      const double d = dt == DType::kF32 ? t.data<float>()[i] : t.GetDouble(i);
      if (!std::isfinite(d)) {
        out->append("null");  // JSON has no NaN or infinity
        continue;
      }
      auto r = dt == DType::kF64 ? std::to_chars(buf, buf + sizeof(buf), d)
                                 : std::to_chars(buf, buf + sizeof(buf), static_cast<float>(d));
      out->append(buf, r.ptr);
    }
  }
  out->push_back(']');
}

}  // namespace kiln::serve
