# zinf — make targets. `make demo` runs the main job; `make test` runs the tests.
GO        ?= go
BIN       := bin
PKGS      := ./...
TESTFLAGS ?= -race -count=1 -timeout 15m
DEMO_DIR  ?=
# The GoMLX adapter: its own module, so zinf's core keeps its dependencies.
GOMLX_DIR := contrib/gomlx
# Every GoMLX program of the project is built with Go's SIMD experiment:
# GoMLX's pure-Go backend then has AVX2/AVX-512 matmul kernels (fp32, bf16,
# f16, f64), 20-40x its portable loops on this machine (see README, "Build
# with SIMD"). Empty: the portable build (make test-contrib tests both).
GOMLX_GOEXPERIMENT ?= simd
GOMLX_ENV := CGO_ENABLED=0 GOEXPERIMENT=$(GOMLX_GOEXPERIMENT)

.PHONY: all build build-mpi test test-short test-arm64 test-kernel-mutants bench bench-io bench-adam bench-scale bench-schedule bench-overlap bench-optimizers bench-mpi demo demo-mpi lint fmt vet doctor tune clean gpu-tests stress test-contrib demo-gomlx bench-gomlx demo-generate bench-generate bench-generate-big bench-llamacpp demo-llm bible bench-llm bench-llm-big

all: build

build:
	$(GO) build -o $(BIN)/zinf ./cmd/zinf

# zinf with the MPI binding (needs Open MPI's development files and
# pkg-config: Debian's libopenmpi-dev); runs under mpirun as one rank per
# process.
build-mpi:
	$(GO) build -tags mpi -o $(BIN)/zinf-mpi ./cmd/zinf

# The whole suite: vet, formatting, then every test with the race detector.
test: lint
	$(GO) test $(TESTFLAGS) $(PKGS)

# The optimizer and the decoder's kernels built for arm64 and run under
# qemu-aarch64 (Debian's qemu-user): the NEON kernels bit for bit against
# the scalar loops, and every mutant the kernel generators can build
# caught by those tests.
test-arm64:
	./scripts/test-arm64.sh
	./decoder/kernels/internal/asmgen/mutants.sh arm64

# The decoder's amd64 kernels: the generated assembly is what the generator
# writes, and every mutant the generator can build into it fails the
# differential tests (decoder/kernels/internal/asmgen/mutants.sh). Needs
# AVX2, FMA and F16C; on a CPU without them it says so and runs nothing.
test-kernel-mutants:
	@if [ "$$(uname -m)" = x86_64 ] && grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && grep -qw f16c /proc/cpuinfo; then \
	  ./decoder/kernels/internal/asmgen/mutants.sh amd64; \
	else echo "test-kernel-mutants: this CPU lacks AVX2, FMA or F16C: the decoder's amd64 kernels cannot run here (NOT tested)"; fi

test-short: lint
	$(GO) test -short -count=1 $(PKGS)

lint: vet
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)
	@if pkg-config --exists ompi 2>/dev/null; then $(GO) vet -tags mpi ./comm/... ./cmd/zinf/; \
	  else echo "vet: Open MPI's development files absent: the mpi build tag is not vetted"; fi

fmt:
	gofmt -w $$(git ls-files '*.go')

# Go benchmarks (engine bytes/s and allocs/op, pool, conversions).
bench:
	$(GO) test -run=NONE -bench=. -benchmem -count=1 ./aio/ ./buffers/

# zinf io vs fio on the same 1 GiB file, interleaved (see BENCHMARKS.md).
bench-io: build
	./scripts/bench-io.sh

# Train with model states larger than this machine's memory through a pinned
# pool, today's fp32 configuration against bf16 params, 8-bit moments and
# pinned gradients on the same model: peak RSS, step time vs the disk-bound
# prediction, bytes per parameter at the disk vs the plan, ratio of medians
# (see BENCHMARKS.md). The two alternate in blocks of --steps (fp32, compact,
# compact, fp32), each block writing its state and removing it: the fp32
# state needs about twice itself free on SCALE_DIR (checked first) and the
# compact one almost as much (its gradient stores stay reserved), so both at
# once (91 GiB at 24 GiB of fp32 state) do not fit and per-step alternation
# is out. 24 GiB of fp32 state (1.02x this machine's 23.5 GiB of memory)
# needs 49 GiB, which leaves room for others on a 60 GiB disk. A 6 GiB pool
# keeps every gradient pinned (1 GiB keeps a tenth); both get it. Three
# steps a block, so that each configuration's median is not a first step.
SCALE_DIR   ?= /var/tmp
SCALE_FLAGS ?= --state 24GiB --pool 6GiB --steps 3 --rounds 2
bench-scale: build
	./$(BIN)/zinf bench-scale --path $(SCALE_DIR) $(SCALE_FLAGS)

# SIMD vs scalar Adam, interleaved rounds with medians (see BENCHMARKS.md).
# The two orders of a step's micro-batches (layer-major, micro-batch-major),
# interleaved, k = 1, 4, 8, disk-bound (ROUNDS, KS, SCHED_DIR; see the script).
bench-schedule: build
	./scripts/bench-schedule.sh

# The update overlapping the next forward (zinf.overlap_update) against
# Step waiting for it, interleaved; not in make test.
bench-overlap: build
	./scripts/bench-overlap.sh

bench-adam:
	BENCH=$${BENCH:-Adam} ./scripts/bench-optimizers.sh

# SIMD vs scalar for every update rule (Adam, SGD, Adagrad, Lion), interleaved
# rounds with medians and SIMD/scalar ratios (see BENCHMARKS.md).
bench-optimizers:
	./scripts/bench-optimizers.sh

# Longer randomized runs (scripts/stress.sh): every test with ZINF_STRESS=1
# (STRESS_SEEDS metamorphic seeds, more crash kill points, fault steps,
# property cases, and the MPI runs TestStressMPI*: bigger random
# collectives, random ranks killed at random points), then each fuzz
# target for FUZZTIME. A short run:
# make stress STRESS_SEEDS=30 FUZZTIME=10s
FUZZTIME     ?= 2m
STRESS_SEEDS ?= 200
stress:
	GO='$(GO)' PKGS='$(PKGS)' FUZZTIME='$(FUZZTIME)' ZINF_STRESS_SEEDS='$(STRESS_SEEDS)' ./scripts/stress.sh

demo: build
	./scripts/demo.sh $(DEMO_DIR)

# The GoMLX adapter's tests (fetches GoMLX from the module proxy). Its
# graphs run on GoMLX's pure-Go backend only: vet builds without cgo, and
# the dependency check fails if the XLA backend sneaks in. -race needs cgo
# for the detector itself; checkptr is off because the Go backend's matmul
# (compute v0.1.2) does pointer arithmetic checkptr rejects.
# Both builds are tested: the SIMD one the targets below use, and the
# portable one a program built without the experiment gets.
test-contrib:
	cd $(GOMLX_DIR) && CGO_ENABLED=0 $(GO) vet ./...
	cd $(GOMLX_DIR) && CGO_ENABLED=0 GOEXPERIMENT=simd $(GO) vet ./...
	@cd $(GOMLX_DIR) && if CGO_ENABLED=0 $(GO) list -deps ./... | grep -E 'gomlx/go-xla|gomlx/backends/(xla|default)'; then \
	  echo "contrib/gomlx must not depend on the XLA backend"; exit 1; fi
	cd $(GOMLX_DIR) && GOEXPERIMENT=simd $(GO) test -race -gcflags=all=-d=checkptr=0 -count=1 -timeout 10m ./...
	cd $(GOMLX_DIR) && GOEXPERIMENT= $(GO) test -race -gcflags=all=-d=checkptr=0 -count=1 -timeout 10m ./...

# A GoMLX transformer trained with params and Adam states on NVMe,
# verified bit for bit against in-memory training (docs/gomlx.md).
demo-gomlx:
	cd $(GOMLX_DIR) && $(GOMLX_ENV) $(GO) run ./examples/transformer --verify

# GoMLX's own zoo transformer (4 layers, d=32, cl100k's 100277-token
# vocabulary) trained on the King James Bible for 100 steps with every
# weight, master and Adam state on NVMe ($$DEMO_DIR, default
# /var/tmp/zinf-demo-llm), checked bit for bit against the zoo's model
# trained in memory in one graph; it saves the model there as a zinf
# checkpoint (docs/gomlx.md). Installs Debian's bible-kjv-text (the text)
# and bible-kjv (its reader) when missing.
demo-llm: bible
	cd $(GOMLX_DIR) && $(GOMLX_ENV) $(GO) run ./examples/llm

# Offloaded vs in-memory training of the demo-llm model (zoo transformer,
# vocab 100277) on the same per-layer executors: one process per
# measurement, rounds alternating the order; medians with min..max of CPU
# time per token, wall, GC cycles and mallocs per step, peak RSS vs the
# training state, tokens/s (BENCHMARKS.md), and per layer its compute a
# step against its NVMe I/O (the bar's condition), and the offloaded
# loop's waits (swap-in, commit). ROUNDS, STEPS to change; LLM_FLAGS for
# the model and batch (e.g. -batch 8 -seq 64: compute per layer above the
# I/O of every layer but the embedding's gather). The offloaded process
# runs with zinf.overlap_update (-overlap-update): the embedding table's
# update, which the backward cannot cover (its gradient is final last),
# goes on while Step returns and the next step starts; the next forward
# waits for it at the table, so the wait moves from the commit to that
# swap-in. Against the plain commit in 9 interleaved pairs of rounds on the
# loaded 2-vCPU machine (load 5-12): offloaded/in-memory wall 1.14x
# (0.61..1.63) against 1.43x (1.01..1.93), CPU per token 1.10x (1.07..1.39)
# against 1.15x (1.04..1.30), the offloaded step's waits 152 against
# 147 ms: a narrow win within that load's noise, to be taken again on a
# quiet machine (LLM_FLAGS= runs without it; -pipeline-depth 4 did not
# shorten the wait).
ROUNDS ?= 5
STEPS ?= 10
LLM_FLAGS ?= -overlap-update
bench-llm:
	mkdir -p $(BIN)
	cd $(GOMLX_DIR) && $(GOMLX_ENV) $(GO) build -o $(abspath $(BIN))/zinf-benchllm ./examples/benchllm
	ulimit -v 16000000; $(abspath $(BIN))/zinf-benchllm -rounds $(ROUNDS) -steps $(STEPS) $(LLM_FLAGS)

# One run whose training state exceeds this machine's RAM (not in make
# test; about 31 GiB written to TMPDIR, default /var/tmp, which needs twice
# the state free for zinf's copy-on-write swap files, and deleted after):
# the zoo transformer (124 blocks, d=1024, 8 heads x 128, FFN 4096, vocab
# 100277, tied head computed in blocks of 8192 table rows: 1.66 B
# parameters, 31.0 GiB of state, 1.32x a 23.5 GiB machine's RAM) created
# layer by layer straight into zinf and trained by zgomlx.Loop under
# gradient_accumulation_steps "auto", layer-major:
# 2 warm-up steps at the plan's k, then 5 steps (-steps) at the planner's
# k (the micro-batches whose compute covers the step's NVMe I/O). After
# each step a child process trains 4 of the same blocks with the
# embedding and the head in memory at the same micro-batch shape and k
# for 5 steps; their executors' compute, scaled to 124 blocks, is the
# in-memory compute-bound rate (a block's compute swings 330-640 ms from
# one to the next here, in memory and offloaded: fewer samples moved the
# estimate by 15% from one child to the next). Each step prints tokens/s offloaded and in memory
# and their ratio, peak RSS against pinned pool + activations + 512 MiB,
# NVMe bytes against the plan's, and the busy share of the disk holding
# TMPDIR (/proc/diskstats); a summary table of medians (min..max) ends it
# (BENCHMARKS.md). The head is computed in blocks of the table
# (-tied -head-rows 8192): an untied head's 392 MiB weights and gradient
# are whole GoMLX tensors, which put peak RSS 2 GiB over the bound. The
# swap-ins and gradient hand-overs overlap compute (two layers' of each
# in buffers mapped outside the Go heap), and the Go memory limit while
# training (-train-memlimit 330MiB) holds the heap to what the bound
# leaves after the pool and those buffers: at 2000-2400 MiB the
# collector let the heap's pages reach 490 MiB and the peak RSS 1098-1108
# MiB (with -one-layer, 100 blocks), about 90 over; at 330 MiB the peak
# was 976 MiB (bound 1012), with 690 collections in 5 steps where 420
# MiB and -one-layer took 480 (-one-layer holds one layer's of each:
# 48 MiB fewer buffers, and no overlap). The timed steps run at 330 MiB
# plus the activations the loop keeps at their k (the bound counts them
# too): at a fixed 330 MiB the collector ran about 160 times a step at
# k=11. BIG_MEMLIMIT is the Go memory limit (GOMEMLIMIT) while
# creating.
# BIG_FLAGS to change the model (add -overlap-update for
# zinf.overlap_update: the timed steps then run back to back and the
# in-memory slices after them; -checksums=false for the same run without
# the CRC-32C); a short check of the program (2.9 GiB of state, 3
# minutes): BIG_FLAGS='-layers 4 -dim 1024 -heads 8 -ffn 4096 -vocab
# 100277 -batch 1 -seq 16 -steps 1 -pinned 0 -heap-credit none -one-layer
# -train-memlimit 1600MiB -tied -head-rows 8192'.
# -contend cpu,mem ends the run with the in-memory slice alone and
# beside one goroutine of other work (a floating-point loop; memory
# copies): what a core's worth of the I/O path's work (checksums,
# gradient sums, the optimizer, copies) costs this machine's compute.
BIG_MEMLIMIT ?= 2GiB
BIG_FLAGS ?= -layers 124 -dim 1024 -heads 8 -ffn 4096 -vocab 100277 -batch 1 -seq 16 -steps 5 -slice-blocks 4 -pinned 0 -heap-credit none -train-memlimit 330MiB -tied -head-rows 8192 -contend mem,mem-paced
bench-llm-big:
	mkdir -p $(BIN)
	cd $(GOMLX_DIR) && $(GOMLX_ENV) $(GO) build -o $(abspath $(BIN))/zinf-benchllm ./examples/benchllm
	ulimit -v 18000000; GOMEMLIMIT=$(BIG_MEMLIMIT) $(abspath $(BIN))/zinf-benchllm -big $(BIG_FLAGS) -dir $${TMPDIR:-/var/tmp}

bible:
	@if ! command -v bible >/dev/null 2>&1 || [ ! -f /usr/lib/bible.data ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing bible-kjv-text bible-kjv"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bible-kjv-text bible-kjv >/dev/null; \
	  else echo "the King James Bible is missing: apt-get install -y bible-kjv-text bible-kjv"; exit 1; fi; fi

# Text from GoMLX's zoo transformer with its weights on NVMe, streamed
# through a pinned pool smaller than them (contrib/gomlx/cmd/zinf-generate):
# from what make demo-llm saved in DEMO_LLM_DIR (its checkpoint, model.json
# and cl100k tokenizer) when it is there, else from CKPT (a zinf checkpoint
# of GEN_MODEL), else from a fresh GEN_MODEL; prints the text, the predicted
# and measured tokens/s, and checks the greedy tokens against GoMLX's
# in-memory generation (the last line).
DEMO_LLM_DIR ?= /var/tmp/zinf-demo-llm
CKPT ?= $(if $(wildcard $(DEMO_LLM_DIR)/model.json),$(DEMO_LLM_DIR))
GEN_MODEL ?= vocab=256,dim=256,layers=8,heads=8,kv-heads=4,ffn=1024
GEN_FLAGS ?= --pool 8MiB --max-new-tokens 32 --batch auto
demo-generate:
	cd $(GOMLX_DIR) && ck="$(if $(CKPT),$(abspath $(CKPT)))"; \
	if [ -n "$$ck" ] && [ -f "$$ck/model.json" ]; then src="--checkpoint $$ck"; \
	elif [ -n "$$ck" ]; then src="--checkpoint $$ck --model $(GEN_MODEL)"; else src="--model $(GEN_MODEL)"; fi; \
	ulimit -v 16000000; $(GOMLX_ENV) $(GO) run ./cmd/zinf-generate $$src $(GEN_FLAGS) --dir $${TMPDIR:-/var/tmp} \
	  --prompt "In the beginning God created the heaven and the earth." \
	  --prompt "And the earth was without form, and void;" \
	  --prompt "And God said, Let there be light:" \
	  --prompt "And God saw the light, that it was good:" --verify

# Decoding tokens/s by batch and pinned pool, interleaved rounds, against
# zinf.PlanGeneration's prediction (scripts/bench-generate.sh; BENCH_GEN_*
# variables; not part of make test).
bench-generate:
	cd $(GOMLX_DIR) && $(GOMLX_ENV) $(GO) build -o $(abspath $(BIN))/zinf-generate ./cmd/zinf-generate
	ulimit -v 16000000; ZINF_GENERATE=$(abspath $(BIN))/zinf-generate sh scripts/bench-generate.sh

# Issue 19's bar (b): a zoo transformer whose bf16 weights exceed RAM
# (26.25 GiB by default, written with random weights, deleted at the end)
# generating through zinf and from an mmap'ed file, side by side in
# separate processes (scripts/bench-generate-big.sh; BIG_* variables): zinf
# keeps what the RAM holds of the weights in its pinned pool for good
# (BIG_CACHE_MIB, default the memory available less 7 GiB) and streams the
# rest. Tens of minutes and the model's size on disk: run it under the
# machine's big-run lock. Not part of make test.
bench-generate-big:
	cd $(GOMLX_DIR) && $(GOMLX_ENV) $(GO) build -o $(abspath $(BIN))/zinf-generate ./cmd/zinf-generate
	ZINF_GENERATE=$(abspath $(BIN))/zinf-generate sh scripts/bench-generate-big.sh

# zinf's native decoder (cmd/zinf-decode) and llama.cpp side by side on the
# same GGUF files (internal/cmd/bench-llamacpp): one llama model of random
# weights written in f32, bf16 and q8_0, a greedy-continuation check, then
# decoding tokens/s at batch 1 and 4 over interleaved rounds; medians,
# min..max and zinf / llama.cpp; then past RAM: one bf16 model of 1.12x
# the machine's memory (about 28 GB here: skipped, saying so, without the
# disk room), llama.cpp's mapped file against zinf-decode -stream (in
# place through the pinned pool, as much kept as the memory allows),
# seconds a token at batch 1, zinf's floor by its plan and its peak RSS
# (BENCH_LLAMACPP_FLAGS='-parts ram' skips it; about 15 minutes more).
# LLAMA_CPP is llama.cpp's directory
# (build/bin: llama-bench, llama-batched-bench, llama-simple); without it
# the bench says so and is skipped. Not part of make test.
LLAMA_CPP ?= /var/tmp/llamacpp
BENCH_LLAMACPP_FLAGS ?= -size 400m -tokens 32 -rounds 3
bench-llamacpp:
	$(GO) build -o $(BIN)/zinf-decode ./cmd/zinf-decode
	$(GO) run ./internal/cmd/bench-llamacpp -llama-cpp $(LLAMA_CPP) -zinf-decode $(BIN)/zinf-decode -dir $${TMPDIR:-/var/tmp} $(BENCH_LLAMACPP_FLAGS)

# Offloaded vs in-memory GoMLX training: step time, allocations, GC, RSS
# (separate processes, alternating; see BENCHMARKS.md), without and with
# zgomlx.Options.HeapCredit (fewer GC cycles for a larger heap).
bench-gomlx:
	mkdir -p $(BIN)
	cd $(GOMLX_DIR) && $(GOMLX_ENV) $(GO) build -o ../../$(BIN)/gomlx-transformer ./examples/transformer
	./$(BIN)/gomlx-transformer --bench 5 --heap-credit none
	./$(BIN)/gomlx-transformer --bench 5 --heap-credit auto

# The simulated training as an MPI job of 4 ranks (NP=n for another size),
# compared bit for bit with the in-process world.
demo-mpi: build-mpi
	./scripts/demo-mpi.sh $(DEMO_DIR)

# Step time and collective traffic per rank at world 1, 2, 4 under mpirun,
# and the binding's all-gather / reduce-scatter against bare MPI
# collectives in the same job (see BENCHMARKS.md).
bench-mpi: build-mpi
	./scripts/bench-mpi.sh

doctor: build
	./$(BIN)/zinf doctor --path $${TMPDIR:-/tmp}

tune: build
	./$(BIN)/zinf tune --path $${TMPDIR:-/tmp}

# Test binaries for a GPU machine (run there with ZINF_GPU_TESTS=1).
gpu-tests:
	mkdir -p .gpu
	$(GO) test -c -o .gpu/gds.test ./gds/
	$(GO) test -c -o .gpu/cuda.test ./accel/cuda/
	$(GO) test -c -o .gpu/nccl.test ./comm/nccl/
	$(GO) build -o .gpu/zinf ./cmd/zinf

clean:
	rm -rf $(BIN) .gpu
