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

test: $(STAMP)
	$(PY) -m pytest -q -p no:randomly src tests
	$(PY) -m mypy src/torchdoctor

install: $(STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# torch goes in first and alone: every later install runs under constraints.txt (torch==2.13.0), so no
# dependency can pull a multi-GB CUDA torch. torchvision/timm are left out on purpose (see README).
$(STAMP): $(VENV)/bin/python pyproject.toml constraints.txt
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -c constraints.txt -e '.[test]'
	touch $(STAMP)

typecheck: $(STAMP)
	$(PY) -m mypy src/torchdoctor

bench: $(STAMP)
	$(PY) bench/table.py

bench-all: $(STAMP)
	for f in bench/*.py; do $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) build src/*.egg-info
