#!/usr/bin/env bash
# Installs the ONNX Runtime peer of `make bench-serve` into bench/ort/node_modules: the npm package
# onnxruntime-node at the version package-lock.json pins, with --ignore-scripts (its postinstall
# downloads CUDA binaries from outside the npm registry and fails offline; the CPU runtime,
# bin/napi-v6/linux/x64/libonnxruntime.so.1, ships inside the npm tarball). Idempotent: quick when
# already installed. Needs node and npm: NodeSource's `nodejs` package has both; with Debian's
# `nodejs` (scripts/install-deps.sh --bench installs it where missing) npm is the `npm` package.
set -euo pipefail
cd "$(dirname "$0")"
if [ -f node_modules/onnxruntime-node/bin/napi-v6/linux/x64/onnxruntime_binding.node ]; then
  exit 0
fi
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "bench/ort/install.sh: $tool not found (apt-get install nodejs npm)" >&2; exit 1; }
done
echo "bench/ort: npm ci --ignore-scripts (onnxruntime-node)"
npm ci --ignore-scripts --no-audit --no-fund
