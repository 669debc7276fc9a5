# Two commands: `make demo` and `make test`. Each sets up .venv on a fresh machine first.
SHELL := /bin/bash
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export DIFFUSERS_OFFLINE := 1
export HF_HUB_DISABLE_TELEMETRY := 1
export DO_NOT_TRACK := 1
export TOKENIZERS_PARALLELISM := false
export PIP_DISABLE_PIP_VERSION_CHECK := 1

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.torchdoctor-installed

.PHONY: demo test install typecheck bench bench-all clean

demo: $(STAMP)
	$(PY) -m torchdoctor demo

# bitsandbytes takes another CPU branch on AVX512-BF16 machines (tests/support/hardware.py): the suite pins the
# portable one and runs per-layer branches both ways; this second pass runs its bitsandbytes tests on the forced
# AVX512-BF16 import branch, so every machine (and CI) runs both whatever its CPU.
BNB_TESTS := tests/move/test_cast_rule.py tests/move/test_move.py tests/move/test_move_finds_optimizers.py \
	tests/move/test_optimizer.py tests/plugin/test_pytest_plugin.py tests/realworld/test_zoo.py \
	tests/trace/test_trace_libraries.py tests/trace/test_trace_snapshot.py tests/virtual/test_cpu_packed.py \
	tests/virtual/test_simulate.py tests/distributed/test_cli.py
BNB_K := 4bit or 8bit or bnb or kbit or packed or quant or bitsandbytes or qlora or branch

# pytest-xdist: TEST_WORKERS processes (2 on CI's 2 cores; each computes on one thread, tests/conftest.py), the
# tests of a module sharing a module-scoped fixture in one of them (--dist loadgroup). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadgroup

test: $(STAMP)
	$(PY) -m pytest -q -p no:randomly $(XDIST) src tests
	TD_TEST_BNB_AVX512BF16=1 $(PY) -m pytest -q -p no:randomly $(XDIST) $(BNB_TESTS) -k "$(BNB_K)"
	$(PY) -m mypy src/torchdoctor

install: $(STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# torch goes in first and alone: every later install runs under constraints.txt (torch==2.13.0), so no
# dependency can pull a multi-GB CUDA torch. torchvision/timm are left out on purpose (see README).
$(STAMP): $(VENV)/bin/python pyproject.toml constraints.txt
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -c constraints.txt -e '.[test]'
	# an editable install compiles nothing: the checkout's bytecode is written now, as pip does for a wheel, so the
	# first `torchdoctor run` or `virtual_devices` block does not pay ~140 ms of compiling (bench/RESULTS.md)
	$(PY) -m compileall -q src/torchdoctor
	touch $(STAMP)

typecheck: $(STAMP)
	$(PY) -m mypy src/torchdoctor

bench: $(STAMP)
	$(PY) bench/table.py

bench-all: $(STAMP)
	for f in bench/*.py; do $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) build src/*.egg-info
