#!/usr/bin/env bash
# Every GPU measurement of benchmarks/README.md ("On a GPU") in one go, one JSON at the end; the steps' limits add up
# to 8 minutes (about 4 measured), so that a short turn on a shared GPU machine holds the whole run
# on one H100/H200: run it from the repository root on a machine with torch+CUDA and vitscope's dependencies.
#
#   bash benchmarks/gpu.sh [OUT_DIR]        (default benchmarks/results/gpu)
#
# Environment: IMAGES (2048), BATCH (64), WORKERS (8), ROUNDS (2), SKIP_INSTALL=1 to use vitscope from src/
# without installing wheels. Wheels found in .whl/ (packages the machine lacks, e.g. pycocotools and
# pytorch-metric-learning) are installed into /tmp/site first, without network.
set -uo pipefail
OUT_DIR=${1:-benchmarks/results/gpu}
IMAGES=${IMAGES:-2048}
BATCH=${BATCH:-64}
WORKERS=${WORKERS:-8}
ROUNDS=${ROUNDS:-2}
PY=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
SCRATCH=$(mktemp -d)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
if [ -d .whl ] && [ -z "${SKIP_INSTALL:-}" ]; then  # benchmarks/gpu_wheels.sh: one wheel at a time, since
  # some are for other Pythons (pip refuses a whole list for one unsupported wheel)
  for wheel in .whl/*.whl; do
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$wheel" \
      2>/dev/null || echo "not installed (another Python's wheel?): $wheel"
  done
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
# What vitscope imports that this machine lacks: a measurement that fails names its module here first.
$PY - <<'PRE'
import importlib
missing = []
for name in ("torch", "transformers", "safetensors", "numpy", "PIL", "skimage", "matplotlib", "pandas", "rich",
             "typer", "yaml", "pycocotools", "scipy", "sklearn", "pytorch_metric_learning", "captum", "h5py",
             "jinja2", "cv2"):
    try:
        importlib.import_module(name)
    except Exception as error:
        missing.append(f"{name} ({type(error).__name__})")
print("missing modules:", ", ".join(missing) if missing else "none")
PRE
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$SCRATCH/card.txt" 2>&1
status=0
step() {  # step NAME SECONDS COMMAND...: run (stopped after SECONDS: a hang must not spend the device session),
  # time and log one measurement; a failure is recorded, the rest still run
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  echo "=== $name: $*"
  timeout "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "$name $rc $((SECONDS - start))" >> "$SCRATCH/steps.txt"
  [ "$rc" = 0 ] || status=1
}
: > "$SCRATCH/steps.txt"
# Whole passes over JPEGs against plain DataLoader scripts (analyze's attention pass, probe's extraction).
step gpu_pass 210 $PY benchmarks/gpu_pass.py --images "$IMAGES" --batch-size "$BATCH" --workers "$WORKERS" \
  --rounds "$ROUNDS" --device cuda --out "$OUT_DIR/gpu_pass.json"
# From preprocessed batches in memory: bare forward, forward + record, the seven updates (and each alone).
step attention_suite 60 $PY benchmarks/attention_suite.py --device cuda --batch-size "$BATCH" --repeats 3 \
  --no-naive --per-analysis --out "$OUT_DIR/attention_suite.json"
# The loader's uint8 pixels normalised on the GPU give the CPU's float32 bits (every byte value).
step normalise 45 $PY benchmarks/gpu_normalise_check.py
# CUDA's own count of host synchronisations in every analysis's hot loop (empty lists when clean).
step sync 60 $PY benchmarks/gpu_sync_check.py
# Two processes sharing the one GPU against one, and their numbers equal.
step distributed 100 $PY benchmarks/distributed.py --device cuda --images 1024 --batch-size "$BATCH" --rounds 1 \
  --out "$OUT_DIR/distributed.json"
$PY - "$OUT_DIR" "$SCRATCH" <<'EOF'
import json, pathlib, sys
out, scratch = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
doc = {"card": (scratch / "card.txt").read_text().strip(),
       "steps": [dict(zip(("name", "rc", "seconds"), line.split()))
                 for line in (scratch / "steps.txt").read_text().splitlines()]}
for name in ("gpu_pass", "attention_suite", "distributed"):
    path = out / f"{name}.json"
    doc[name] = json.loads(path.read_text()) if path.exists() else None
for name in ("normalise", "sync"):
    log = out / f"{name}.log"
    lines = log.read_text().strip().splitlines() if log.exists() else []
    doc[name] = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
(out / "gpu.json").write_text(json.dumps(doc, indent=2) + "\n")
print(f"wrote {out / 'gpu.json'}")
EOF
exit $status
