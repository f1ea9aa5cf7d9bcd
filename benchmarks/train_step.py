"""Cost of one zoo training step with the fused attention kernel against explicit attention.

For every ViT recipe of the core zoo, the script builds the entry's model and recipe exactly as
``vitscope zoo build`` does (its batch size, bf16 autocast, one thread: one build job), then times
``fit`` for ``--steps`` steps with ``LoopConfig.math_attention`` off (the baseline: PyTorch's fused
``scaled_dot_product_attention``) and on (``q k^T``, softmax, ``@ v``); the ratio is fused / explicit.
Variants are interleaved round by round, in alternating order, so drift in machine speed hits both alike;
each number is the median over ``--repeats`` rounds.
The training data is rendered once per entry, before any timing.

Run: ``python benchmarks/train_step.py [--entries tiny-vit-sup,...] [--steps 20] [--repeats 3]``.
Writes ``benchmarks/results/train_step.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _datasets import RESULTS_DIR

from vitscope.train.data import TensorImages
from vitscope.train.loop import LoopConfig, fit
from vitscope.zoo.build import make_recipe, training_set
from vitscope.zoo.catalog import ZOO, get_entry
from vitscope.zoo.store import build_model, wrap_zoo_model

DEFAULT_ENTRIES = [e.name for e in ZOO if e.arch == "tiny-vit" and not e.extra]


def time_steps(name: str, data: TensorImages, steps: int, math: bool) -> float:
    """Seconds per training step of zoo entry ``name`` (fresh model and recipe, seed 0)."""
    entry = get_entry(name)
    recipe = make_recipe(entry, wrap_zoo_model(build_model(entry), name), int(data.labels.max()) + 1)
    config = LoopConfig(steps=steps, batch_size=entry.batch_size, progress=False, autocast="bf16",
                        math_attention=math)
    start = time.perf_counter()
    fit(recipe, data, config)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", default=",".join(DEFAULT_ENTRIES))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "train_step.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    print(f"{'entry':<22} {'batch':>5} {'fused s/step':>12} {'math s/step':>12} {'fused / math':>12}")
    for name in args.entries.split(","):
        data = training_set(get_entry(name))
        for math in (False, True):  # warm-up: allocator, kernels, lazy imports
            time_steps(name, data, 2, math=math)
        runs: dict[str, list[float]] = {"fused": [], "math": []}
        for r in range(args.repeats):
            for math in ((False, True) if r % 2 == 0 else (True, False)):
                runs["math" if math else "fused"].append(time_steps(name, data, args.steps, math=math))
        fused, math = statistics.median(runs["fused"]), statistics.median(runs["math"])
        rows.append({"entry": name, "batch_size": get_entry(name).batch_size, "fused_s": fused, "math_s": math,
                     "ratio": fused / math, "runs": runs})
        print(f"{name:<22} {rows[-1]['batch_size']:>5} {fused:>12.3f} {math:>12.3f} {fused / math:>12.2f}",
              flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "steps": args.steps, "repeats": args.repeats,
                                    "threads": args.threads, "torch": torch.__version__,
                                    "machine": platform.machine(), "processor": platform.processor()}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
