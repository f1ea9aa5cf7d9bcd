# vitscope developer commands. `make test` and `make demo` are all a fresh clone needs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed

.PHONY: test demo install bench zoo clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

demo: $(STAMP)
	$(VENV)/bin/vitscope analyze --model tiny-vit --data skimage --out demo_out

bench: $(STAMP)
	$(PY) benchmarks/recording_overhead.py
	$(PY) benchmarks/streaming_memory.py

# Retrain the whole tiny zoo from its recipes (about 45 minutes on 2 cores); commit weights only when a recipe changed.
zoo: $(STAMP)
	$(VENV)/bin/vitscope zoo build

clean:
	rm -rf $(VENV) demo_out .pytest_cache
