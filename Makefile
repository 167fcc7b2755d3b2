# Quick start: `make demo` runs the main job, `make test` builds and runs the tests.
# SANITIZE=1 builds with -fsanitize=address,undefined into its own tree.
SANITIZE ?= 0
JOBS ?= $(shell nproc)
ifeq ($(SANITIZE),1)
BUILD ?= build-asan
CMAKE_FLAGS += -DTETHER_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug -DTETHER_BUILD_BENCH=OFF
else
BUILD ?= build
CMAKE_FLAGS += -DCMAKE_BUILD_TYPE=RelWithDebInfo
endif

.PHONY: all deps configure build test demo bench install-test format clean

all: build

deps:
	@./scripts/deps.sh

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

configure: deps $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) --timeout 600

demo: build
	$(BUILD)/bin/tether demo

bench: configure
	cmake --build $(BUILD) -j $(JOBS) --target benches tether_cli
	@for b in $(BUILD)/bench/bench_*; do echo "# $$b" >&2; $$b || exit 1; done

format:
	clang-format -i $$(git ls-files '*.cpp' '*.hpp')

clean:
	rm -rf build build-asan
