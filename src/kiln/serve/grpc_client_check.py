"""A Python gRPC client (python3-grpcio, stubs generated from proto/inference.proto by protoc and
grpc_python_plugin) against `kiln serve --grpc-port`: the interop half of grpc_process_test.sh.

  grpc_client_check.py STUBS_DIR GRPC_PORT HTTP_PORT OUT_DIR            answers and errors
  grpc_client_check.py STUBS_DIR GRPC_PORT HTTP_PORT OUT_DIR --drain PID  SIGTERM with 3 queued
  grpc_client_check.py STUBS_DIR GRPC_PORT HTTP_PORT OUT_DIR --repository REPO
      the repository RPCs against `kiln serve --model-repository REPO` (REPO/mlp/1 the artifact,
      REPO/broken/1 empty): index (equal to REST's), reload to a new version, a failed reload
      that keeps serving, unload, errors

OUT_DIR holds rows.csv (64 pixels a row) and predict.csv (`kiln predict` on those rows).
"""
import csv
import json
import os
import shutil
import signal
import struct
import sys
import time
import urllib.request

sys.path.insert(0, sys.argv[1])
import grpc  # noqa: E402
from kiln.serve.proto import inference_pb2 as pb  # noqa: E402
from kiln.serve.proto import inference_pb2_grpc as pb_grpc  # noqa: E402

grpc_port, http_port, out = sys.argv[2], sys.argv[3], sys.argv[4]
channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
stub = pb_grpc.GRPCInferenceServiceStub(channel)
rows = [[float(v) for v in r] for r in csv.reader(open(f"{out}/rows.csv"))]
predicted = list(csv.reader(open(f"{out}/predict.csv")))[1:]


def request(row, raw, rid):
    r = pb.ModelInferRequest(model_name="mlp", id=rid)
    t = r.inputs.add(name="x", datatype="FP32", shape=[1, 64])
    if raw:
        r.raw_input_contents.append(struct.pack("<64f", *row))
    else:
        t.contents.fp32_contents.extend(row)
    return r


def logits_of(resp):
    o = resp.outputs[0]
    assert o.name == "logits" and o.datatype == "FP32" and list(o.shape) == [1, 10], o
    if resp.raw_output_contents:
        return list(struct.unpack("<10f", resp.raw_output_contents[0]))
    return list(o.contents.fp32_contents)


def metrics():
    return urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10).read().decode()


if "--drain" in sys.argv:
    pid = int(sys.argv[sys.argv.index("--drain") + 1])
    futures = [stub.ModelInfer.future(request(rows[i], i == 1, f"d{i}"), timeout=20)
               for i in range(3)]
    deadline = time.time() + 10
    while 'kiln_inference_queue_depth{model="mlp",version="1"} 3' not in metrics():
        assert time.time() < deadline, "the 3 gRPC requests never showed as queued"
        time.sleep(0.05)
    os.kill(pid, signal.SIGTERM)
    for i, f in enumerate(futures):
        resp = f.result()  # raises unless OK
        assert resp.id == f"d{i}", resp
    print("SIGTERM drained 3 queued gRPC requests (all OK)")
    sys.exit(0)

def rpc_code(method, req):
    try:
        method(req, timeout=60)
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def index(ready=False):
    r = stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=ready), timeout=10)
    return [(m.name, m.version, m.state) for m in r.models], r


def served_version():
    resp = stub.ModelInfer(request(rows[0], False, "v"), timeout=20)
    assert abs(logits_of(resp)[0] - float(predicted[0][0])) <= 1e-4 * (1 + abs(float(predicted[0][0])))
    return resp.model_version


if "--repository" in sys.argv:
    repo = sys.argv[sys.argv.index("--repository") + 1]
    meta = stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=10)
    assert "model_repository" in meta.extensions, meta
    got, full = index()
    assert got == [("broken", "", "UNAVAILABLE"), ("mlp", "1", "READY")], got
    assert "manifest.json" in full.models[0].reason, full
    assert index(ready=True)[0] == [("mlp", "1", "READY")]
    rest = json.load(urllib.request.urlopen(urllib.request.Request(
        f"http://127.0.0.1:{http_port}/v2/repository/index", data=b"{}"), timeout=10))
    assert [(e["name"], e.get("version", ""), e["state"]) for e in rest] == got, (rest, got)
    assert served_version() == "1"
    shutil.copytree(f"{repo}/mlp/1", f"{repo}/mlp/2")
    code, details = rpc_code(stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name="mlp"))
    assert code == grpc.StatusCode.OK, (code, details)
    assert index(ready=True)[0] == [("mlp", "2", "READY")]
    assert served_version() == "2"
    os.makedirs(f"{repo}/mlp/3")  # a broken newer version: the reload fails, 2 keeps serving
    code, details = rpc_code(stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name="mlp"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "mlp/3" in details, (code, details)
    assert served_version() == "2"
    code, details = rpc_code(stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name="nope"))
    assert code == grpc.StatusCode.NOT_FOUND and "no model 'nope'" in details, (code, details)
    code, details = rpc_code(stub.RepositoryModelUnload,
                             pb.RepositoryModelUnloadRequest(model_name="mlp"))
    assert code == grpc.StatusCode.OK, (code, details)
    code, details = rpc_code(stub.ModelInfer, request(rows[0], False, "gone"))
    assert code == grpc.StatusCode.NOT_FOUND and details == "unknown model 'mlp'", (code, details)
    assert index()[0] == [("broken", "", "UNAVAILABLE"), ("mlp", "", "UNAVAILABLE")], index()[0]
    text = metrics()
    assert 'kiln_grpc_requests_total{method="RepositoryModelLoad",code="OK"} 1' in text, text
    print("gRPC repository RPCs: index equals REST's, reload to version 2, a failed reload kept "
          "version 2 serving, unload, errors as specified")
    sys.exit(0)


assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live
assert stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready
meta = stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=10)
assert meta.name == "kiln", meta
m = stub.ModelMetadata(pb.ModelMetadataRequest(name="mlp"), timeout=10)
assert m.name == "mlp" and list(m.versions) == ["1"], m
assert [(t.name, t.datatype, list(t.shape)) for t in m.inputs] == [("x", "FP32", [-1, 64])], m
assert stub.ModelReady(pb.ModelReadyRequest(name="mlp", version="1"), timeout=10).ready
# The standard health service, by hand: an empty HealthCheckRequest; SERVING is status = 1.
check = channel.unary_unary("/grpc.health.v1.Health/Check")
assert check(b"", timeout=10) == b"\x08\x01", "grpc.health.v1 is not SERVING"

for i, row in enumerate(rows):
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32",
                                   "data": row}]}).encode()
    rest = json.load(urllib.request.urlopen(urllib.request.Request(
        f"http://127.0.0.1:{http_port}/v2/models/mlp/infer", data=body), timeout=10))
    rest_logits = rest["outputs"][0]["data"]
    want = [float(v) for v in predicted[i][:10]]
    for raw in (False, True):
        resp = stub.ModelInfer(request(row, raw, f"row{i}"), timeout=20)
        assert resp.id == f"row{i}" and resp.model_version == "1", resp
        assert bool(resp.raw_output_contents) == raw, "answered in another form than asked"
        got = logits_of(resp)
        # gRPC's float32 equals REST's shortest round-trip decimal parsed back to float32.
        assert got == list(struct.unpack("<10f", struct.pack("<10f", *rest_logits))), (got, rest)
        for g, w in zip(got, want):
            assert abs(g - w) <= 1e-4 * (1 + abs(w)), (i, got, want)
        p = resp.outputs[1]
        pred = (struct.unpack("<i", resp.raw_output_contents[1])[0] if raw
                else p.contents.int_contents[0])
        assert p.datatype == "INT32" and pred == int(predicted[i][10]), (resp, predicted[i])


def code_of(req):
    try:
        stub.ModelInfer(req, timeout=10)
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


bad = request(rows[0], False, "bad")
bad.inputs[0].shape[1] = 63
code, details = code_of(bad)
assert code == grpc.StatusCode.INVALID_ARGUMENT and "inputs[0]" in details, (code, details)
bad = request(rows[0], True, "bad")
bad.inputs[0].datatype = "INT32"
code, details = code_of(bad)
assert code == grpc.StatusCode.INVALID_ARGUMENT and "inputs[0].datatype: INT32" in details, details
code, details = code_of(pb.ModelInferRequest(model_name="nope"))
assert code == grpc.StatusCode.NOT_FOUND and details == "unknown model 'nope'", (code, details)
text = metrics()
n = 2 * len(rows)
assert f'kiln_grpc_requests_total{{method="ModelInfer",code="OK"}} {n}' in text, text
assert 'kiln_grpc_requests_total{method="ModelInfer",code="INVALID_ARGUMENT"} 2' in text, text
print(f"gRPC answers equal REST's and kiln predict's on {len(rows)} rows, typed and raw; "
      "health, metadata and error codes as specified")
