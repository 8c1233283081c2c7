# Kiln top-level entry points. Each target installs what it needs, configures and builds.
#   make test   deps -> configure -> build -> deps audit -> all tests (what .ci/run calls), the
#               thread_safety_lint test among them (label lint: clang -Wthread-safety over the
#               sources that annotate their locking, scripts/thread_safety_check.py)
#   make demo   deps -> build -> train an MLP on the digits data through the engine, then the
#               single-device playbook (scripts/playbook.sh: verify, train, preempt, resume,
#               profile, evaluate, export a small CNN)
#   make bench  Kiln vs the PyTorch peer (python3-torch), same threads, alternating: ratios of
#               medians, also written to bench/out/results.json (installs the peer packages)
#   make bench-dist  all-reduce bandwidth of Kiln's MPI Communicator against raw MPI_Allreduce, 2
#               ranks, 1-256 MiB, and the data-parallel step time of 2 ranks x 1 thread against
#               1 rank x 2 threads (GPT and MLP examples): bench/out/dist.json
#   make bench-serve  kiln serve under load (overhead against a bare Beast server, c=1/8/64,
#               open-loop Poisson at 50/90/200% of saturation, batching's payoff) and its compute
#               against ONNX Runtime (npm onnxruntime-node, bench/ort/) and int8 against f32:
#               bench/out/serve.json (installs the peer packages and bench/ort/node_modules)
#   make build  configure and build only
#   make format / make format-check   clang-format the C++ sources / fail if any is not (CI runs it)
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release

.PHONY: all deps configure build test demo bench bench-dist bench-serve clean format format-check

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS) > $(BUILD_DIR).configure.log 2>&1 || (cat $(BUILD_DIR).configure.log; exit 1)

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# ../shared/tools/deps-audit.sh (beside the project, where the workplace provides it) fails when the
# build used a package that neither a new machine nor scripts/install-deps.sh provides.
DEPS_AUDIT ?= ../shared/tools/deps-audit.sh

test: build
	@if [ -x $(DEPS_AUDIT) ]; then $(DEPS_AUDIT) $(BUILD_DIR); \
	 else echo "deps audit skipped: $(DEPS_AUDIT) not found"; fi
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -LE slow

demo: build
	@OMP_WAIT_POLICY=PASSIVE $(BUILD_DIR)/src/kiln/cli/kiln demo --data examples/data/digits.csv.gz
	@bash scripts/playbook.sh $(BUILD_DIR)

BENCH_THREADS ?= 2
bench: configure
	@bash scripts/install-deps.sh --bench
	@cmake --build $(BUILD_DIR) --target train_bench matmul_benchmark -j $(JOBS)
	@$(BUILD_DIR)/bench/train_bench --threads=$(BENCH_THREADS)

# 2 ranks, unbound (both would be pinned to core 0 otherwise), with the malloc tunable that keeps
# OpenMPI's per-call temporaries above 32 MiB from page-faulting (docs/distributed.md).
bench-dist: configure
	@cmake --build $(BUILD_DIR) --target dist_bench kiln -j $(JOBS)
	@mkdir -p bench/out
	@timeout -k 5 600 mpirun --allow-run-as-root --bind-to none -np 2 \
	  -x GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1073741824 \
	  $(BUILD_DIR)/bench/dist_bench --out=bench/out/dist.json
	@python3 bench/dist_step_bench.py $(BUILD_DIR)/src/kiln/cli/kiln examples/gpt_text.yaml bench/out/dist.json
	@python3 bench/dist_step_bench.py $(BUILD_DIR)/src/kiln/cli/kiln examples/mlp_digits.yaml bench/out/dist.json --steps 200

# Same threads on both sides (BENCH_THREADS); our process gets the malloc settings DESIGN.md §5
# asks for; the peer is a node process (bench/ort/peer.js) with its own thread pool.
bench-serve: configure
	@bash scripts/install-deps.sh --bench
	@bash bench/ort/install.sh
	@cmake --build $(BUILD_DIR) --target serve_bench -j $(JOBS)
	@mkdir -p bench/out
	@GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296 \
	  $(BUILD_DIR)/bench/serve_bench --threads $(BENCH_THREADS) --out bench/out/serve.json

# Every C++ file as .clang-format (Google base) says: `make format` rewrites them, `make format-check`
# (run by .ci/run) fails naming each file that differs.
CXX_SOURCES = find src tests bench \( -name '*.h' -o -name '*.cc' \) -print0

format:
	@$(CXX_SOURCES) | xargs -0 clang-format -i

format-check: deps
	@bad=$$($(CXX_SOURCES) | xargs -0 clang-format --dry-run 2>&1 | awk -F: '/: (error|warning): code should be clang-formatted/ {print $$1}' | sort -u); \
	 if [ -n "$$bad" ]; then echo "$$bad" | sed 's/$$/: not clang-formatted (run make format)/'; exit 1; fi; \
	 echo "format-check: every C++ file is clang-formatted"

clean:
	rm -rf $(BUILD_DIR) $(BUILD_DIR).configure.log
