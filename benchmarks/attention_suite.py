"""Cost of the whole attention suite (paper 002's attention analyses + rollout + entropy/focus) per batch,
relative to a bare forward pass of the same model, measured in the same process.

Model: Hugging Face ``transformers.ViTModel`` sized as ViT-B/16 (hidden 768, 12 layers, 12 heads, MLP
3072), random weights, 224 px, no pooler, eval mode, default attention implementation (sdpa). Batch 32
(``--batch-size``). Images: ``_datasets.SyntheticImages``, each with one deterministic elliptical
instance mask so that ``saliency_iou`` runs too.

Variants, per batch (preprocessed pixels, ``torch.inference_mode``), interleaved round by round:

* ``bare``  - ``model(pixel_values=x)``. The denominator.
* ``suite`` - what ``vitscope.run``'s inner loop does per batch with ``attention_suite(spec, {"masks"})``:
              open ``backbone.record("blocks.*.attn.pattern")``, forward, ``update`` of all seven analyses
              (``cls_attention_maps``, ``spatial_average_maps``, ``aligned_attention``,
              ``attention_distance``, ``saliency_iou``, ``attention_focus``, ``attention_rollout``), then
              ``rec.clear()``. Split into "forward + record" and "updates". The goal applies to this row.
* ``naive`` - the same forward + record, then every statistic computed per analysis straight from the
              ``vitscope.functional`` definitions (each makes its own renormalised copies; the aligned map
              scatters every entry of every image; no sharing). For context (``--no-naive`` skips it).

``compute()`` of the suite (random baseline, taxonomy...) runs once per run and is timed separately. The batch
carries the ground truth the engine's loader makes (``Analysis.target_transforms``: the masks on the token grid),
so the updates are timed as a pass runs them.
Goal (issue 5, CPU): suite / bare <= 1.5.

Busy rounds (other processes using more than ``--busy-cores`` of CPU, read from /proc) are replaced by
extra rounds as in ``recording_overhead.py``; medians come from quiet rounds when there are at least two.

``compiled`` (``--no-compiled`` skips it) runs the suite's updates again with the shared per-block statistics
through ``torch.compile`` (``vitscope.run(..., compile_stats=True)``); the warm-up round pays the compilation.

Run: ``python benchmarks/attention_suite.py [--batch-size 32] [--repeats 3] [--threads N] [--no-naive]``.
Writes ``benchmarks/results/attention_suite.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import torch
import transformers
from _datasets import RESULTS_DIR, SyntheticImages, cpu_model
from _timing import CompileRecord
from recording_overhead import MODELS, OtherLoad, build_model, sync

import vitscope
import vitscope.functional as F
from vitscope.analyses import attention_suite
from vitscope.analyses.attention.saliency import mask_to_grid
from vitscope.analyses.base import Batch
from vitscope.analyses.batch import SharedQuantities, union_plan
from vitscope.functional.attention_blocks import Workspace

GOAL = 1.5
PATTERN = "blocks.*.attn.pattern"


def ellipse_mask(index: int, size: int) -> np.ndarray:
    """``[1, size, size]`` bool: one ellipse whose centre and radii depend on ``index``."""
    rng = np.random.default_rng(index)
    cy, cx = rng.uniform(0.3, 0.7, 2) * size
    ry, rx = rng.uniform(0.15, 0.35, 2) * size
    yy, xx = np.mgrid[:size, :size]
    return (((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0)[None]


def naive_update(record, batch: Batch, gt: torch.Tensor) -> float:
    """Every statistic of the suite from the functional definitions, analysis by analysis (no sharing)."""
    spec, grid = batch.spec, batch.grid
    p = spec.num_prefix_tokens
    patterns = [record[f"blocks.{i}.attn.pattern"] for i in range(spec.num_blocks)]
    total = 0.0
    for x in patterns:
        cls = F.cls_attention_map(x, grid, p)
        sam = F.spatial_average_map(x, grid, p)
        total += float(cls.sum(0).sum()) + float(sam.sum(0).sum())
        total += float(F.aligned_attention(x, grid, p).sum(0).sum())
        total += float(F.attention_distance(x, grid, p).sum())
        for m in (cls, sam):
            pred = F.mass_mask(m, 0.6).flatten(-2)
            inter = (pred & gt[:, None]).sum(-1).double()
            union = (pred | gt[:, None]).sum(-1).double()
            total += float((inter / union).amax(-1).sum())
        total += float(F.attention_entropy(x).sum()) + float(F.focus_index(x, grid, p).sum())
    total += float(F.rollout(patterns).sum())
    return total


def bench(args: argparse.Namespace, device: torch.device) -> dict:
    model = build_model("b", args.seed).to(device)
    backbone = vitscope.wrap(model, name="ViT-B/16")
    spec = backbone.spec
    images = SyntheticImages(args.batch_size, size=224, seed=args.seed)
    pixels = backbone.preprocess([images.get(i).image for i in range(len(images))]).to(device)
    masks = [ellipse_mask(i, 224) for i in range(args.batch_size)]
    batch = Batch(pixels=pixels, indices=list(range(args.batch_size)), paths=[f"synthetic:{i}" for i in
                  range(args.batch_size)], spec=spec, grid=spec.grid_for(*pixels.shape[-2:]),
                  targets={"masks": masks})
    for suite_member in attention_suite(spec, targets={"masks"}):  # ground truth the loader makes, as in a pass
        for key, (given, fn) in suite_member.target_transforms(spec).items():
            batch.targets[key] = [fn(v) for v in batch.targets[given]]
    gt = torch.from_numpy(np.stack([mask_to_grid(m, spec, batch.grid).reshape(-1) for m in masks])).to(device)

    def clock() -> float:
        sync(device)
        return time.perf_counter()

    suites: list[list] = []

    def t_bare() -> dict[str, float]:
        with torch.inference_mode():
            t0 = clock()
            model(pixel_values=pixels)
            return {"bare": clock() - t0}

    workspace = Workspace()  # the run's work buffers, as vitscope.run keeps them

    def t_suite(compiled: bool = False) -> dict[str, float]:
        suite = attention_suite(spec, targets={"masks"})
        plan = union_plan([a.shared_quantities(spec) for a in suite])
        each: dict[str, float] = {}
        with torch.inference_mode():
            t0 = clock()
            with backbone.record(PATTERN) as rec:
                backbone(pixels)
                t1 = clock()
                batch.shared = SharedQuantities(rec, plan, workspace, compiled)  # per batch, as in the engine
                for a in suite:
                    start = clock() if args.per_analysis else 0.0
                    a.update(rec, batch)
                    if args.per_analysis:  # the first analysis to ask pays the shared per-block pass
                        each[f"update_{a.name}"] = clock() - start
                rec.clear()
            t2 = clock()
        if compiled:  # the same updates with the shared statistics through torch.compile (compile_stats)
            return {"compiled_suite": t2 - t0, "compiled_updates": t2 - t1,
                    **{f"compiled_{k}": v for k, v in each.items()}}
        suites.append(suite)
        return {"suite": t2 - t0, "suite_forward": t1 - t0, "suite_updates": t2 - t1, **each}

    def t_naive() -> dict[str, float]:
        with torch.inference_mode():
            t0 = clock()
            with backbone.record(PATTERN) as rec:
                backbone(pixels)
                t1 = clock()
                naive_update(rec, batch, gt)
                rec.clear()
            t2 = clock()
        return {"naive": t2 - t0, "naive_updates": t2 - t1}

    t_compiled = functools.partial(t_suite, True)
    variants = [t_bare, t_suite] + ([t_compiled] if args.compiled else []) + ([t_naive] if args.naive else [])
    print(f"[ViT-B/16, batch {args.batch_size}] warm-up x{args.warmup} ...", flush=True)
    compiling = CompileRecord()
    for i in range(args.warmup):
        for fn in variants:
            if fn is t_compiled and i == 0:  # the compilation is paid here
                with compiling:
                    fn()
                print(f"compile_stats: {compiling.as_dict()}", flush=True)
            else:
                fn()
    rounds: list[dict] = []
    extra = 0
    while sum(r["quiet"] for r in rounds) < args.repeats:
        if len(rounds) >= args.repeats:
            if extra >= args.max_extra_rounds:
                break
            extra += 1
        rnd: dict = {"ms": {}, "others": 0.0}
        for fn in variants:
            with OtherLoad() as load:
                got = fn()
            rnd["ms"].update({k: v * 1e3 for k, v in got.items()})
            rnd["others"] = max(rnd["others"], load.cores)
        rnd["quiet"] = rnd["others"] <= args.busy_cores
        rounds.append(rnd)
        m = rnd["ms"]
        print(f"round {len(rounds)}: bare {m['bare']:.0f} ms, suite {m['suite']:.0f} ms (updates "
              f"{m['suite_updates']:.0f})" + (f", naive {m['naive']:.0f} ms" if "naive" in m else "")
              + (f", compiled updates {m['compiled_updates']:.0f}" if "compiled_updates" in m else "")
              + f"; other processes {rnd['others']:.2f} cores" + ("" if rnd["quiet"] else " (busy)"), flush=True)

    t0 = time.perf_counter()
    results = {a.name: a.result() for a in suites[-1]}  # states home, then compute()
    compute_s = time.perf_counter() - t0
    quiet = [r for r in rounds if r["quiet"]]
    used = quiet if len(quiet) >= 2 else rounds
    keys = sorted({k for r in used for k in r["ms"]})
    med = {k: statistics.median(r["ms"][k] for r in used) for k in keys}
    best = {k: min(r["ms"][k] for r in used) for k in keys}
    ratios = {"suite": med["suite"] / med["bare"], "suite_forward_record": med["suite_forward"] / med["bare"],
              "suite_updates": med["suite_updates"] / med["bare"]}
    if "compiled_updates" in med:
        ratios.update({"compiled_updates": med["compiled_updates"] / med["bare"],
                       "compiled_suite": med["compiled_suite"] / med["bare"]})
    if "naive" in med:
        ratios.update({"naive": med["naive"] / med["bare"], "suite_vs_naive": med["suite"] / med["naive"]})
    robust = {"suite_min_over_min": best["suite"] / best["bare"],
              "suite_median_of_paired": statistics.median(r["ms"]["suite"] / r["ms"]["bare"] for r in used)}
    sal = results["saliency_iou"]
    return {
        "model": "ViT-B/16", "config": {k: v for k, v in MODELS["b"].items() if k != "label"},
        "attn_implementation": model.config._attn_implementation, "batch_size": args.batch_size,
        "analyses": [a.name for a in suites[-1]], "median_ms": med, "min_ms": best, "ratios_vs_bare": ratios,
        "ratios_robustness": robust, "compute_s": compute_s, "rounds": rounds,
        **({"compile": compiling.as_dict()} if args.compiled and args.warmup else {}),
        "rounds_used": "quiet" if used is quiet else "all (fewer than 2 quiet rounds)",
        "num_rounds": len(rounds), "num_quiet_rounds": len(quiet), "goal_ratio": GOAL,
        "goal_applies": device.type == "cpu", "meets_goal": ratios["suite"] <= GOAL,
        "sanity": {"cls_best_iou": sal["cls_best_iou"].tolist(), "random_cls_best_iou": sal["random_cls_best_iou"]
                   .tolist(), "mean_distance": results["attention_distance"]["block_mean"].tolist()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3, help="timed quiet rounds wanted (median reported)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--busy-cores", type=float, default=0.15,
                   help="a round is busy when other processes used more CPU than this many cores")
    p.add_argument("--max-extra-rounds", type=int, default=3)
    p.add_argument("--naive", action=argparse.BooleanOptionalAction, default=True,
                   help="also time the functional-core-per-analysis version")
    p.add_argument("--compiled", action=argparse.BooleanOptionalAction, default=True,
                   help="also time the updates with the shared statistics through torch.compile (compile_stats; "
                        "the warm-up round pays the compilation)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--per-analysis", action="store_true",
                   help="also time every analysis's update on its own (synchronising between them)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(RESULTS_DIR / "attention_suite.json"))
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    info = {"device": str(device), "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
            "cpu_model": cpu_model(), "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "platform": platform.platform(), "repeats": args.repeats,
            "warmup": args.warmup, "loadavg_start": os.getloadavg()[0]}
    r = bench(args, device)
    info["loadavg_end"] = os.getloadavg()[0]
    m, q = r["median_ms"], r["ratios_vs_bare"]
    print(f"\nAttention suite, ViT-B/16, 224 px, batch {r['batch_size']}, {info['device']}, "
          f"{info['torch_threads']} threads; {r['num_quiet_rounds']}/{r['num_rounds']} quiet rounds "
          f"(medians over {r['rounds_used']})")
    print(f"  bare forward (sdpa)           {m['bare']:8.0f} ms")
    print(f"  suite: forward + record       {m['suite_forward']:8.0f} ms   x{q['suite_forward_record']:.2f}")
    print(f"  suite: 7 updates              {m['suite_updates']:8.0f} ms   +{q['suite_updates']:.2f}")
    print(f"  suite total                   {m['suite']:8.0f} ms   x{q['suite']:.2f}  (goal <= {GOAL}: "
          f"{'yes' if r['meets_goal'] else 'NO'})")
    if "naive" in m:
        print(f"  naive (functional, unshared)  {m['naive']:8.0f} ms   x{q['naive']:.2f}  "
              f"(suite / naive {q['suite_vs_naive']:.2f})")
    for key in sorted(k for k in m if k.startswith("update_")):
        print(f"    {key.removeprefix('update_'):26s}{m[key]:8.1f} ms")
    if "compiled_updates" in m:
        print(f"  compile_stats: 7 updates      {m['compiled_updates']:8.0f} ms   +{q['compiled_updates']:.2f}  "
              f"(op by op +{q['suite_updates']:.2f})")
        for key in sorted(k for k in m if k.startswith("compiled_update_")):
            print(f"    {key.removeprefix('compiled_update_'):26s}{m[key]:8.1f} ms")
    print(f"  checks: min/min x{r['ratios_robustness']['suite_min_over_min']:.2f}, median of per-round ratios "
          f"x{r['ratios_robustness']['suite_median_of_paired']:.2f}; compute() once {r['compute_s']:.2f} s")
    print(f"  load average {info['loadavg_start']:.2f} -> {info['loadavg_end']:.2f} on {info['cpu_count']} cores")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"info": info, "result": r}, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
