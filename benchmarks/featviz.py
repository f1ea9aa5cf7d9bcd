"""Cost of one feature-visualisation step relative to a bare forward + backward to the input.

Model: Hugging Face ``transformers.ViTModel`` with random weights, ViT-S/16- or ViT-B/16-sized, 224 px,
eval mode, weights frozen (``requires_grad=False``) in both variants.

* ``bare``: ``x`` ``[8, 3, 224, 224]`` with ``requires_grad``; ``model(pixel_values=x)``, the sum of the
  last hidden state, ``backward()`` to ``x``. The denominator.
* ``ours``: one step of :func:`vitscope.featviz.render` with the published recipe (8 augmented copies,
  jitter, ColorShift, noise, total variation, Adam, cosine schedule, clamp) on a unit of the LAST block
  (``blocks.{L-1}.mlp.post``), so the truncated forward saves almost nothing and the ratio measures the
  recipe's overhead. A step's time is the gap between consecutive callbacks (median over the steps).

Rounds interleave the two variants so that machine-speed drift hits both alike; medians over rounds.
Goal (issue): ours / bare <= 1.15. ``--full-run`` also times a whole 400-step render (the GPU goal:
under 15 s for ViT-B at batch 8).

Run: ``python benchmarks/featviz.py [--model s|b] [--rounds 3] [--steps-per-round 4] [--device cpu]
[--full-run]``; prints the ratio and writes ``benchmarks/results/featviz.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from transformers import ViTConfig, ViTModel

import vitscope
from vitscope.featviz import FeatvizConfig, FFNChannel, render

MODELS = {
    "s": dict(label="ViT-S/16", hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536),
    "b": dict(label="ViT-B/16", hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def build(size: str, device: torch.device):
    cfg = dict(MODELS[size])
    cfg.pop("label")
    torch.manual_seed(0)
    model = ViTModel(ViTConfig(**cfg, image_size=224, patch_size=16), add_pooling_layer=False).eval().to(device)
    for p in model.parameters():
        p.requires_grad_(False)
    return vitscope.wrap(model)


def bare_step(backbone, x: torch.Tensor) -> float:
    """One forward + backward to the input; seconds."""
    _sync(x.device)
    t0 = time.perf_counter()
    xi = x.detach().requires_grad_(True)
    out = backbone(xi).last_hidden_state
    out.sum().backward()
    _sync(x.device)
    return time.perf_counter() - t0


def our_steps(backbone, steps: int, device: torch.device, seed: int) -> list[float]:
    """Per-step seconds of a render, from callback timestamps (the first step is dropped as warm-up)."""
    stamps: list[float] = []

    def cb(info) -> None:
        _sync(device)
        stamps.append(time.perf_counter())

    unit = FFNChannel(backbone.spec.num_blocks - 1, 7)
    render(backbone, unit, FeatvizConfig(steps=steps + 1, seed=seed), callback=cb, device=device)
    return [b - a for a, b in zip(stamps, stamps[1:])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="s")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps-per-round", type=int, default=4)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--full-run", action="store_true", help="Also time a whole 400-step render at batch 8.")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "featviz.json")
    args = ap.parse_args()
    device = torch.device(args.device)
    backbone = build(args.model, device)
    x = torch.rand(8, 3, 224, 224, device=device)
    bare_step(backbone, x)  # warm-up
    our_steps(backbone, 1, device, seed=99)
    bare, ours = [], []
    for r in range(args.rounds):
        ours.append(statistics.median(our_steps(backbone, args.steps_per_round, device, seed=r)))
        bare.append(statistics.median(bare_step(backbone, x) for _ in range(args.steps_per_round)))
    ratio = statistics.median(ours) / statistics.median(bare)
    doc = {"model": MODELS[args.model]["label"], "device": str(device), "threads": torch.get_num_threads(),
           "python": platform.python_version(), "torch": torch.__version__, "batch": 8,
           "bare_s": bare, "ours_s": ours, "ratio": ratio, "goal_ratio": 1.15}
    print(f"{doc['model']} on {device}: bare fwd+bwd {statistics.median(bare) * 1e3:.1f} ms, "
          f"featviz step {statistics.median(ours) * 1e3:.1f} ms, ratio {ratio:.3f} (goal <= 1.15)")
    if args.full_run:
        _sync(device)
        t0 = time.perf_counter()
        render(backbone, FFNChannel(backbone.spec.num_blocks - 1, 7), FeatvizConfig(steps=400), device=device)
        _sync(device)
        doc["full_400_steps_s"] = time.perf_counter() - t0
        print(f"400 steps at batch 8 (unit in the last block): {doc['full_400_steps_s']:.2f} s "
              "(GPU goal < 15 s, ViT-B)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
