#!/usr/bin/env bash
# Installs every Debian package Kiln needs, by group, so that a new machine (only the packages of
# ../shared/tools/new-machine-packages.txt) needs nothing else. Idempotent: quiet and fast when all
# is already there. Needs root (or sudo) only when something is missing.
#
#   scripts/install-deps.sh           build + test (what `make test` and `make demo` use)
#   scripts/install-deps.sh --bench   build + test + bench (what `make bench` and `make bench-serve` add)
#
# Every package a later feature needs goes into the group that uses it: multi-host, serving, ...
# Keep parentheses out of the arrays, comments included: deps-audit.sh ends an array at the first one.
# ../shared/tools/deps-audit.sh (run by `make test`) reads the arrays below: a package the build
# used that is in none of them, nor on a new machine, fails the test run.
set -euo pipefail

# Configure and build: compiler, CMake, and the libraries the code links.
BUILD_PKGS=(
  build-essential cmake ccache pkg-config
  libdnnl-dev            # oneDNN 2.6: matmul, conv, pooling, softmax, norms, eltwise
  ocl-icd-opencl-dev     # dnnl-config.cmake requires OpenCL; libdnnl-dev only recommends it
  libabsl-dev            # absl::Status and friends
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev libyaml-cpp-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
  zlib1g-dev             # gzip datasets: digits.csv.gz
  libopenmpi-dev openmpi-bin  # kiln::dist_mpi, the OpenMPI Communicator, and mpirun for its tests
)

# kiln serve: the HTTP server on Boost.Beast/Asio, header-only here, simdjson for request bodies,
# and gRPC with its protobuf code generators for the gRPC service.
SERVE_PKGS=(
  libboost-dev
  libsimdjson-dev
  libgrpc++-dev libprotobuf-dev  # kiln serve --grpc-port: the gRPC service, kiln::serve_grpc
  protobuf-compiler protobuf-compiler-grpc  # protoc and grpc_cpp_plugin generate its C++ at build time
)

# kiln data import: JPEG and PNG decoding, SentencePiece tokenizers for text corpora.
DATA_PKGS=(
  libjpeg62-turbo-dev libpng-dev
  libsentencepiece-dev
  libgdcm-dev            # DICOM decoding for kiln data import dicom: every syntax incl. JPEG 2000
)

# Tests and the demo: the PyTorch oracle that the GPT interop test (gpt_torch_logits) runs; without
# it that test would skip, and CI would not check what it claims.
TEST_PKGS=(
  python3-torch
  clang-format           # make format-check, run by CI
  slurmctld slurmd slurm-client munge  # the Slurm test starts a private one-node cluster
  prometheus             # a real Prometheus scrapes kiln serve in serve_prometheus
  curl                   # the kiln serve process tests talk HTTP with it
  iproute2               # ip netns: the multi-host tests' namespace hosts
  python3-pydicom        # real DICOM files in many transfer syntaxes for dicom_import_test
  python3-grpcio python3-protobuf  # serve_grpc_python: a Python gRPC client talks to kiln serve
)

# Data for the workloads (docs/workloads.md): the fortunes in 11 languages plus English, the
# multilingual corpus of workload 2 (examples/lm_multilingual.yaml). fortunes-fr is not in bookworm.
WORKLOAD_PKGS=(
  fortunes fortunes-min fortunes-de fortunes-it fortunes-ru fortunes-es fortunes-pl
  fortunes-cs fortunes-bg fortunes-br fortunes-zh fortunes-eo fortunes-ga
)

# make bench: an optimized BLAS for the peer (without OpenBLAS, torch's f32 matmuls go through the
# reference BLAS, ~30x slower: an unfair peer).
BENCH_PKGS=(
  libopenblas0-pthread
  nodejs                 # make bench-serve: the ONNX Runtime peer, npm onnxruntime-node, runs in node
)

PKGS=("${BUILD_PKGS[@]}" "${SERVE_PKGS[@]}" "${DATA_PKGS[@]}" "${TEST_PKGS[@]}" "${WORKLOAD_PKGS[@]}")
case "${1:-}" in
  "") ;;
  --bench) PKGS+=("${BENCH_PKGS[@]}") ;;
  *) echo "usage: $0 [--bench]" >&2; exit 2 ;;
esac

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
