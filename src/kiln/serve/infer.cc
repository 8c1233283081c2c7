// POST /v2/models/{m}[/versions/{v}]/infer: the request checked against the model's signature,
// queued on its batcher, answered from the batcher's callback.
#include <charconv>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kiln/serve/clock.h"
#include "kiln/serve/oip.h"
#include "kiln/serve/server.h"

namespace kiln::serve {
namespace {

struct Requested {
  int output;  // index into the model's outputs
  bool binary;
};

std::string Expected(const compiler::TensorSpec& s, int64_t max_batch) {
  std::vector<std::string> d = {"N"};
  for (int i = 1; i < s.shape.rank(); ++i) d.push_back(std::to_string(s.shape.dim(i)));
  return absl::StrCat(OipDatatype(s.dtype), " [", absl::StrJoin(d, ","), "] with N in 1..",
                      max_batch);
}

// The body's inputs in the model's order; InvalidArgument naming the field.
absl::Status MatchInputs(const ServedModel& m, InferBody& body, std::vector<Tensor>* out,
                         int64_t* rows) {
  const auto& specs = m.inputs();
  const int64_t max_batch = m.config().max_batch_size;
  std::vector<int> slot(specs.size(), -1);
  *rows = -1;
  for (size_t i = 0; i < body.inputs.size(); ++i) {
    const std::string at = absl::StrCat("inputs[", i, "]");
    const InferInput& in = body.inputs[i];
    size_t k = 0;
    while (k < specs.size() && specs[k].name != in.name) ++k;
    if (k == specs.size()) {
      std::vector<std::string> names;
      for (const auto& s : specs) names.push_back(s.name);
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".name: model '", m.name(), "' has no input '", in.name,
                       "' (inputs: ", absl::StrJoin(names, ", "), ")"));
    }
    if (slot[k] >= 0)
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".name: input '", in.name, "' given twice"));
    slot[k] = static_cast<int>(i);
    const compiler::TensorSpec& s = specs[k];
    const Shape& shape = in.tensor.shape();
    if (in.tensor.dtype() != s.dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".datatype: ", OipDatatype(in.tensor.dtype()), "; '", s.name, "' takes ",
                       Expected(s, max_batch)));
    }
    bool ok = shape.rank() == s.shape.rank() && shape.dim(0) >= 1 && shape.dim(0) <= max_batch;
    for (int d = 1; ok && d < shape.rank(); ++d) ok = shape.dim(d) == s.shape.dim(d);
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(at, ".shape: ", shape.ToString(), "; '",
                                                     s.name, "' takes ", Expected(s, max_batch)));
    }
    if (*rows >= 0 && shape.dim(0) != *rows) {
      return absl::InvalidArgumentError(absl::StrCat(at, ".shape: ", shape.dim(0),
                                                     " rows, but the inputs before it have ", *rows,
                                                     " (all must agree)"));
    }
    *rows = shape.dim(0);
  }
  for (size_t k = 0; k < specs.size(); ++k) {
    if (slot[k] < 0)
      return absl::InvalidArgumentError(absl::StrCat("inputs: missing input '", specs[k].name,
                                                     "' (", Expected(specs[k], max_batch), ")"));
    out->push_back(std::move(body.inputs[slot[k]].tensor));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Requested>> MatchOutputs(const ServedModel& m, const InferBody& body) {
  std::vector<Requested> out;
  const auto& specs = m.outputs();
  if (body.outputs.empty()) {
    for (size_t k = 0; k < specs.size(); ++k)
      out.push_back({static_cast<int>(k), body.binary_data_output});
    return out;
  }
  for (size_t i = 0; i < body.outputs.size(); ++i) {
    const RequestedOutput& r = body.outputs[i];
    size_t k = 0;
    while (k < specs.size() && specs[k].name != r.name) ++k;
    if (k == specs.size()) {
      std::vector<std::string> names;
      for (const auto& s : specs) names.push_back(s.name);
      return absl::InvalidArgumentError(
          absl::StrCat("outputs[", i, "].name: model '", m.name(), "' has no output '", r.name,
                       "' (outputs: ", absl::StrJoin(names, ", "), ")"));
    }
    out.push_back({static_cast<int>(k), r.binary < 0 ? body.binary_data_output : r.binary == 1});
  }
  return out;
}

HttpResponse BuildResponse(const std::string& name, const std::string& version, bool has_id,
                           const std::string& id, const std::vector<InferOutput>& outputs) {
  std::string json = "{\"model_name\":";
  AppendJsonString(name, &json);
  json += ",\"model_version\":";
  AppendJsonString(version, &json);
  if (has_id) {
    json += ",\"id\":";
    AppendJsonString(id, &json);
  }
  json += ",\"outputs\":[";
  std::string binary;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& t = outputs[i].tensor;
    if (i > 0) json += ',';
    json += "{\"name\":";
    AppendJsonString(outputs[i].name, &json);
    absl::StrAppend(&json, ",\"datatype\":\"", OipDatatype(t.dtype()), "\",\"shape\":[",
                    absl::StrJoin(t.shape().dims(), ","), "]");
    if (outputs[i].binary) {
      absl::StrAppend(&json, ",\"parameters\":{\"binary_data_size\":", t.byte_size(), "}}");
      binary.append(static_cast<const char*>(t.raw_data()), t.byte_size());
    } else {
      json += ",\"data\":";
      AppendJsonData(t, &json);
      json += '}';
    }
  }
  json += "]}";
  HttpResponse r;
  if (binary.empty()) {
    r.body = std::move(json);
    return r;
  }
  r.content_type = "application/octet-stream";
  r.headers.emplace_back("Inference-Header-Content-Length", std::to_string(json.size()));
  r.body = std::move(json);
  r.body += binary;
  return r;
}

}  // namespace

void InferenceServer::SubmitInfer(std::shared_ptr<ServedModel> model, InferBody body,
                                  ModelMetrics* metrics, std::function<void(InferDone)> done) {
  auto fail = [&](absl::Status s) {
    metrics->Count(OutcomeFor(s));
    InferDone d;
    d.status = std::move(s);
    done(std::move(d));
  };
  auto request = std::make_unique<BatchRequest>();
  absl::Status s = MatchInputs(*model, body, &request->inputs, &request->rows);
  if (!s.ok()) return fail(std::move(s));
  absl::StatusOr<std::vector<Requested>> wanted = MatchOutputs(*model, body);
  if (!wanted.ok()) return fail(wanted.status());
  request->priority = body.priority;
  request->timeout_us = body.timeout_us;
  // The callback outlives this frame: it owns copies of what it needs (never the model).
  std::vector<std::string> names;
  for (const Requested& w : *wanted) names.push_back(model->outputs()[w.output].name);
  auto ctx = std::make_shared<
      std::tuple<std::function<void(InferDone)>, std::vector<Requested>, std::vector<std::string>>>(
      std::move(done), std::move(*wanted), std::move(names));
  request->done = [metrics, ctx](absl::Status st, std::unique_ptr<BatchRequest> r) {
    auto& [cb, want, out_names] = *ctx;
    InferDone d;
    d.queue_us = r->dispatch_us - r->enqueue_us;
    d.compute_us = r->complete_us > 0 ? r->complete_us - r->dispatch_us : 0;
    d.batch_rows = r->batch_rows;
    metrics->queue.Observe(d.queue_us * 1e-6);
    metrics->Count(OutcomeFor(st));
    if (st.ok()) {
      for (size_t i = 0; i < want.size(); ++i)
        d.outputs.push_back({out_names[i], r->outputs[want[i].output], want[i].binary});
    }
    d.status = std::move(st);
    cb(std::move(d));
  };
  absl::Status q = model->Submit(std::move(request));
  if (!q.ok()) {
    metrics->Count(OutcomeFor(q));
    InferDone d;
    d.status = std::move(q);
    std::get<0> (*ctx)(std::move(d));
  }
}

void InferenceServer::Infer(std::shared_ptr<ServedModel> model, HttpRequest& req, Call& call,
                            HttpReplier& reply) {
  auto bad = [&](const absl::Status& s) {
    call.metrics->Count(Outcome::kBadRequest);
    HttpResponse r;
    r.status = 400;
    r.body = ErrorJson(std::string(s.message()));
    Finish(call, std::move(r), reply);
  };
  std::string_view json = req.body, binary;
  if (const std::string* h = req.Header("inference-header-content-length")) {
    size_t n = 0;
    auto res = std::from_chars(h->data(), h->data() + h->size(), n);
    if (res.ec != std::errc() || res.ptr != h->data() + h->size() || n > req.body.size()) {
      return bad(absl::InvalidArgumentError(absl::StrCat("Inference-Header-Content-Length: '", *h,
                                                         "' is not a length within the ",
                                                         req.body.size(), "-byte body")));
    }
    json = std::string_view(req.body).substr(0, n);
    binary = std::string_view(req.body).substr(n);
  }
  absl::StatusOr<InferBody> body = ParseInferRequest(json, binary, options_.max_input_elements);
  if (!body.ok()) return bad(body.status());
  call.id = body->id;
  const bool has_id = body->has_id;
  ModelMetrics* metrics = call.metrics;
  auto ctx = std::make_shared<std::pair<Call, HttpReplier>>(std::move(call), std::move(reply));
  SubmitInfer(std::move(model), std::move(*body), metrics, [this, ctx, has_id](InferDone d) {
    auto& [c, rep] = *ctx;
    if (d.queue_us >= 0) {
      c.queue_us = d.queue_us;
      c.compute_us = d.compute_us;
      c.batch_rows = d.batch_rows;
    }
    if (!d.status.ok()) return Finish(c, ErrorResponse(d.status), rep);
    Finish(c, BuildResponse(c.model, c.version, has_id, c.id, d.outputs), rep);
  });
}

}  // namespace kiln::serve
