"""Exports a Kiln zoo model's weights to ONNX with torch.onnx.export, for bench/ort/peer.js.

    /usr/bin/python3 bench/ort/export_onnx.py SPEC_JSON WEIGHTS.safetensors BATCH OUT.onnx

SPEC_JSON is {"kind": "tiny", "features": F} (y = x + x: the peer's per-call floor, no weights;
WEIGHTS is then ignored), {"kind": "mlp", "widths": [in, hidden..., classes]} (kiln::nn::MlpClassifier, relu,
layers fc0, fc1, ...) or {"kind": "cnn", "channels": C, "height": H, "width": W, "widths": [...],
"blocks": B, "classes": K} (kiln::nn::ResNetCnn: stem, stage{s}/down, stage{s}/block{b}/conv1|2,
head). The weights are Kiln's own (Linear weights [in, out], conv weights OIHW), read from the
safetensors file Kiln wrote; the model takes x [BATCH, features] like Kiln's predict graph and
returns logits and their argmax. Needs only Debian's python3-torch (torch 1.13's exporter does not
need the onnx package).
"""
import json
import struct
import sys

import torch
import torch.nn.functional as F


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise SystemExit(f"{path}: tensor {name} is {info['dtype']}, expected F32")
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(body[begin:end]), dtype=torch.float32)
        out[name] = t.reshape(info["shape"]).clone()
    return out


class Mlp(torch.nn.Module):
    def __init__(self, spec, w):
        super().__init__()
        n = len(spec["widths"]) - 1
        self.ws = torch.nn.ParameterList(
            [torch.nn.Parameter(w[f"fc{i}/weight"].t().contiguous()) for i in range(n)])
        self.bs = torch.nn.ParameterList([torch.nn.Parameter(w[f"fc{i}/bias"]) for i in range(n)])

    def forward(self, x):
        for i in range(len(self.ws)):
            x = F.linear(x, self.ws[i], self.bs[i])
            if i + 1 < len(self.ws):
                x = F.relu(x)
        return x, torch.argmax(x, dim=1)


class Cnn(torch.nn.Module):
    def __init__(self, spec, w):
        super().__init__()
        self.spec = spec
        self.p = torch.nn.ParameterDict(
            {k.replace("/", "_"): torch.nn.Parameter(v) for k, v in w.items()})

    def conv(self, name, x):
        return F.conv2d(x, self.p[name + "_weight"], self.p[name + "_bias"], padding=1)

    def forward(self, x):
        s = self.spec
        x = x.reshape(x.shape[0], s["channels"], s["height"], s["width"])
        x = F.relu(self.conv("stem", x))
        for st in range(len(s["widths"])):
            if st > 0:
                x = F.max_pool2d(F.relu(self.conv(f"stage{st}_down", x)), 2, 2)
            for b in range(s["blocks"]):
                y = self.conv(f"stage{st}_block{b}_conv2",
                              F.relu(self.conv(f"stage{st}_block{b}_conv1", x)))
                x = F.relu(x + y)
        x = x.mean(dim=(2, 3))
        logits = F.linear(x, self.p["head_weight"].t(), self.p["head_bias"])
        return logits, torch.argmax(logits, dim=1)


class Tiny(torch.nn.Module):
    def forward(self, x):
        return x + x


def main():
    spec = json.loads(sys.argv[1])
    batch = int(sys.argv[3])
    if spec["kind"] == "tiny":
        model, features, outputs = Tiny(), spec["features"], ["y"]
    else:
        weights = read_safetensors(sys.argv[2])
        model = (Mlp if spec["kind"] == "mlp" else Cnn)(spec, weights).eval()
        features = (spec["widths"][0] if spec["kind"] == "mlp"
                    else spec["channels"] * spec["height"] * spec["width"])
        outputs = ["logits", "prediction"]
    with torch.no_grad():
        torch.onnx.export(model, torch.zeros(batch, features), sys.argv[4], input_names=["x"],
                          output_names=outputs, opset_version=13)


if __name__ == "__main__":
    main()
