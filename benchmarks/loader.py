"""Images per second of vitscope's loader alone: decode ImageNet-sized JPEGs and preprocess them to 224 px, in a
thread of this process (``workers=0``) or in 1, 2, ... worker processes. No model runs.

Data: ``--images`` JPEGs of 500 x 375 (``gpu_pass.make_world``: a ramp plus noise, quality 90) and a
ViT-B/16-sized model directory whose preprocessor resizes to 224 x 224; the loader is
``vitscope.engine.batches.iter_batches`` with the preprocessing ``vitscope.run`` gives it (resize and crop to
uint8; the normalisation happens on the model's device).
The worker counts alternate round by round; medians and the spread are printed, with each count's ratio to the
first count of ``--workers``. Goal (issue 38, a 2-core machine with nothing else running): 2 workers >= 1.7x 0
workers, judged only when ``--workers`` holds both 0 and 2.

Run: ``python benchmarks/loader.py [--images 1024] [--batch-size 64] [--workers 0,1,2] [--rounds 3]``.
Writes ``benchmarks/results/loader.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _datasets import RESULTS_DIR, cpu_model
from gpu_pass import make_world

GOAL = 1.7


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", default="0,1,2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=str(RESULTS_DIR / "loader.json"))
    args = p.parse_args(argv)
    import vitscope
    from vitscope.data import as_source
    from vitscope.engine.batches import iter_batches
    from vitscope.engine.run import loader_preprocessing

    counts = [int(w) for w in args.workers.split(",")]
    speeds: dict[int, list[float]] = {w: [] for w in counts}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, data = make_world(Path(tmp), args.images)
        backbone = vitscope.load_model(str(model_dir))
        source = as_source(str(data))
        preprocess = loader_preprocessing(backbone)  # what vitscope.run gives its loader
        for r in range(args.rounds):
            for w in counts:
                start, n = time.perf_counter(), 0
                for _, batch in iter_batches(source, args.batch_size, preprocess=preprocess, workers=w):
                    n += len(batch.indices)
                speeds[w].append(n / (time.perf_counter() - start))
            print(f"round {r + 1}: " + ", ".join(f"{w} workers {speeds[w][-1]:.0f}" for w in counts) + " images/s",
                  flush=True)
    med = {w: statistics.median(v) for w, v in speeds.items()}
    ratios = {w: med[w] / med[counts[0]] for w in counts}
    print(f"\n{cpu_model()}, {len(os.sched_getaffinity(0))} CPUs; {args.images} JPEGs 500x375 -> 224, batch "
          f"{args.batch_size}; medians of {args.rounds} rounds")
    for w in counts:
        print(f"  {w} workers: {med[w]:6.0f} images/s (x{ratios[w]:.2f} to {counts[0]} workers; rounds "
              f"{min(speeds[w]):.0f}-{max(speeds[w]):.0f})")
    goal_ratio = None
    if 0 in med and 2 in med:  # the goal compares these two counts, whichever --workers lists first
        goal_ratio = med[2] / med[0]
        per_round = [a / b for a, b in zip(speeds[2], speeds[0])]
        print(f"goal: 2 workers >= {GOAL}x 0 workers: x{goal_ratio:.2f} (per round {min(per_round):.2f}-"
              f"{max(per_round):.2f}): {'met' if goal_ratio >= GOAL else 'NOT met'}")
    else:
        print(f"goal (2 workers >= {GOAL}x 0 workers) not judged: --workers lacks 0 or 2")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpu": cpu_model(), "cpus": len(os.sched_getaffinity(0)),
                               "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
                               "images": args.images, "batch_size": args.batch_size, "rounds": speeds,
                               "median": med, "ratio_to_first": ratios, "goal": GOAL,
                               "ratio_2_to_0_workers": goal_ratio}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
