# Kiln top-level entry points. Each target installs what it needs, configures and builds.
#   make test   deps -> configure -> build -> deps audit -> all tests (what .ci/run calls)
#   make demo   deps -> build -> train an MLP on the digits data through the engine, then the
#               single-device playbook (scripts/playbook.sh: verify, train, preempt, resume,
#               profile, evaluate, export a small CNN)
#   make bench  Kiln vs the PyTorch peer (python3-torch), same threads, alternating: ratios of
#               medians, also written to bench/out/results.json (installs the peer packages)
#   make build  configure and build only
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release

.PHONY: all deps configure build test demo bench clean format

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

format:
	@find src tests bench -name '*.h' -o -name '*.cc' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR) $(BUILD_DIR).configure.log
