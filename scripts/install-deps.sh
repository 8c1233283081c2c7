#!/usr/bin/env bash
# Installs every Debian package Kiln's build, tests and demo need. Idempotent: quiet and fast when all
# is already there. Needs root (or sudo) only when something is missing.
set -euo pipefail

PKGS=(
  build-essential cmake ccache pkg-config
  libdnnl-dev            # oneDNN 2.6: matmul, conv, pooling, softmax, norms, eltwise
  libabsl-dev            # absl::Status and friends
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev libyaml-cpp-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
  zlib1g-dev             # gzip datasets (digits.csv.gz)
)

# --bench adds the benchmark peer: Debian's PyTorch and an optimized BLAS for it (without
# OpenBLAS, torch's f32 matmuls go through the reference BLAS, ~30x slower: an unfair peer).
if [ "${1:-}" = "--bench" ]; then
  PKGS=(python3-torch libopenblas0-pthread)
fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
