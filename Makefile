# Quick start: `make demo` runs the main job, `make test` builds and runs the tests.
# SANITIZE=1 builds with -fsanitize=address,undefined into its own tree;
# SANITIZE=thread builds with -fsanitize=thread into build-tsan (not run by CI).
SANITIZE ?= 0
JOBS ?= $(shell nproc)
ifeq ($(SANITIZE),1)
BUILD ?= build-asan
CMAKE_FLAGS += -DTETHER_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug -DTETHER_BUILD_BENCH=OFF
else ifeq ($(SANITIZE),thread)
BUILD ?= build-tsan
CMAKE_FLAGS += -DTETHER_SANITIZE_THREAD=ON -DCMAKE_BUILD_TYPE=Debug -DTETHER_BUILD_BENCH=OFF
# tsan.supp names each suppressed report and why it is not a race.
export TSAN_OPTIONS ?= halt_on_error=0 second_deadlock_stack=1 history_size=4 suppressions=$(CURDIR)/tsan.supp
else
BUILD ?= build
CMAKE_FLAGS += -DCMAKE_BUILD_TYPE=RelWithDebInfo
endif

.PHONY: all deps configure build test demo bench install-test format clean fuzz fuzz-build fuzz-check

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

# libFuzzer harnesses (fuzz/): built with clang in their own tree; `make fuzz`
# runs each for FUZZ_SECONDS from the committed corpus (fuzz/corpus/<harness>),
# new inputs going to $(FUZZ_BUILD)/corpus; `make fuzz-check` (CI) runs each
# for FUZZ_CHECK_SECONDS. A crash or a broken invariant fails either.
FUZZ_SECONDS ?= 60
FUZZ_CHECK_SECONDS ?= 5
FUZZ_BUILD ?= build-fuzz
FUZZ_HARNESSES := sandbox_wire payloads scenario scrub output_tail framing cron sop

fuzz-build:
	@./scripts/deps.sh fuzz
	cmake -S fuzz -B $(FUZZ_BUILD) -G Ninja -DCMAKE_CXX_COMPILER=clang++
	cmake --build $(FUZZ_BUILD) -j $(JOBS)

fuzz: fuzz-build
	@for h in $(FUZZ_HARNESSES); do \
	  mkdir -p $(FUZZ_BUILD)/corpus/$$h; \
	  echo "# fuzz_$$h for $(FUZZ_SECONDS)s" >&2; \
	  $(FUZZ_BUILD)/fuzz_$$h -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	    -artifact_prefix=$(FUZZ_BUILD)/ $(FUZZ_BUILD)/corpus/$$h fuzz/corpus/$$h || exit 1; \
	done

fuzz-check:
	$(MAKE) fuzz FUZZ_SECONDS=$(FUZZ_CHECK_SECONDS)

format:
	clang-format -i $$(git ls-files '*.cpp' '*.hpp')

clean:
	rm -rf build build-asan build-tsan $(FUZZ_BUILD)
