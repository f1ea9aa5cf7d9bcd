# vitscope developer commands. `make test` and `make demo` are all a fresh clone needs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed

.PHONY: test demo install bench zoo zoo-check distributed-check compile-check clean chromium golden vendor-echarts kill-matrix explanations-benchmark sae-benchmark

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# The browser test drives Debian's chromium-headless-shell; install it when missing (root + apt-get only,
# otherwise that one test skips and says why).
CHROMIUM := /usr/lib/chromium/chromium-headless-shell

chromium:
	@if ! command -v chromium-headless-shell >/dev/null 2>&1 && [ ! -x $(CHROMIUM) ]; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium-headless-shell for the browser test"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium-headless-shell >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium-headless-shell >/dev/null 2>&1; } || \
	    echo "could not install chromium-headless-shell: the browser test will skip"; \
	  else \
	    echo "chromium-headless-shell is missing and cannot be installed here: the browser test will skip"; \
	  fi; \
	fi

# Two workers (one per core, each with one intra-op thread: tests/conftest.py), each test file on one worker so
# its module fixtures run once. Bytecode is written so that the CLI and torchrun subprocesses the tests start
# read compiled modules instead of compiling vitscope again each time.
TEST_WORKERS ?= 2

test: $(STAMP) chromium
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

demo: $(STAMP)
	$(VENV)/bin/vitscope demo --out demo_out

# Every golden run (results.json of analyze, compare, probe and the full demo on the synthetic world) against the
# numbers committed before the engine-v2 redesign; `make test` checks the quick ones. About 4 minutes on 2 cores.
golden: $(STAMP)
	cd tests && ../$(PY) -m golden.check

bench: $(STAMP)
	$(PY) benchmarks/recording_overhead.py
	$(PY) benchmarks/streaming_memory.py

# Every attribution method on the zoo's supervised ViT, its spurious twin and the CNN, scored on 32 held-out scenes
# whose backgrounds follow the class half of the time: the numbers of docs/explanations-benchmark.md (minutes).
explanations-benchmark: $(STAMP)
	$(VENV)/bin/vitscope synth --format coco --n 64 --size 64 --seed 10000 --spurious 0.5 --out bench_world
	$(VENV)/bin/vitscope explanations --models tiny-vit-sup,tiny-vit-sup-spurious,tiny-resnet-sup \
	  --data bench_world::coco --limit 32 --steps 8 --out explanations_out

# SAE latents, PCA, ICA, k-means, random directions and the MLP neurons as detectors of the synthetic world's concepts,
# on the zoo's four ViTs: the numbers of docs/sae-benchmark.md (about 4 minutes on 2 cores).
sae-benchmark: $(STAMP)
	$(VENV)/bin/vitscope sae benchmark --models tiny-vit-sup,tiny-vit-distill,tiny-vit-mae,tiny-vit-sup-spurious \
	  --hook blocks.3.resid_post --images 1000 --heldout 500 --latents 512 --k 16 --tokens 262144 --seed 0 \
	  --out sae_benchmark_out

kill-matrix: $(STAMP)  # kill -9 analyze, compare and probe at random points; reruns must equal (a few minutes)
	$(PY) benchmarks/kill_matrix.py

# Retrain the whole tiny zoo from its recipes. All eight models took 46 min on an idle 2-core machine (the six
# core models an estimated 40 min of that, the two later extras the rest) and reproduced every shipped weight
# tensor bit for bit. Commit weights only when a recipe changed.
zoo: $(STAMP)
	$(VENV)/bin/vitscope zoo build

distributed-check: $(STAMP)  # every command over two torchrun processes equals one process (about 1.5 min with SAE training)
	VITSCOPE_DISTRIBUTED_CHECK=1 $(PY) -m pytest tests/e2e/test_distributed.py tests/e2e/test_webdataset_distributed.py \
	  tests/e2e/test_sae_torchrun.py

compile-check: $(STAMP)  # compile_stats with inductor's fused kernels, against op by op (about 30 s cold)
	VITSCOPE_COMPILE_CHECK=1 $(PY) -m pytest tests/unit/test_compiled_statistics.py

# Every shipped zoo model's held-out score measured again and held against its record and the bar (`make test`
# measures four of them; this all eight, about 40 s).
zoo-check: $(STAMP)
	VITSCOPE_ZOO_CHECK=1 $(PY) -m pytest tests/unit/test_zoo_shipped.py tests/validation/test_world_cues.py \
	  tests/validation/test_zoo_robustness.py

clean:
	rm -rf $(VENV) demo_out sae_benchmark_out bench_world explanations_out .pytest_cache

# The report's chart library, vendored (the page loads nothing). Fetches the pinned version from npm; the
# version and SHA-256 pinned in src/vitscope/report/assets.py must match what lands.
ECHARTS_VERSION := 6.1.0
vendor-echarts:
	@tmp=$$(mktemp -d) && cd $$tmp && npm pack -q echarts@$(ECHARTS_VERSION) >/dev/null && \
	  tar xzf echarts-$(ECHARTS_VERSION).tgz package/dist/echarts.min.js package/LICENSE package/NOTICE && \
	  cp package/dist/echarts.min.js $(CURDIR)/src/vitscope/report/vendor/echarts.min.js && \
	  cp package/LICENSE $(CURDIR)/src/vitscope/report/vendor/echarts-LICENSE.txt && \
	  cp package/NOTICE $(CURDIR)/src/vitscope/report/vendor/echarts-NOTICE.txt && rm -rf $$tmp && \
	  sha256sum $(CURDIR)/src/vitscope/report/vendor/echarts.min.js
