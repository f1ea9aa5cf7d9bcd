#!/usr/bin/env bash
# Wheels of vitscope's dependencies that a torch+CUDA machine without network may lack (the H200 lent before
# lacked pycocotools and pytorch-metric-learning), downloaded here into .whl/;
# benchmarks/gpu.sh installs the ones that suit its Python. .whl/ is ignored by git: carry it to the GPU machine
# (the device tool's carry: [".whl"]). Run it before handing the tree over:
#
#   bash benchmarks/gpu_wheels.sh [PYTHON]        (default .venv/bin/python)
set -euo pipefail
PY=${1:-.venv/bin/python}
mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: -d .whl pytorch-metric-learning captum
for version in 3.10 3.11 3.12; do  # pycocotools is compiled: one wheel per Python (cp312's abi3 serves 3.13 too)
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$version" \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl pycocotools
done
ls -1 .whl
