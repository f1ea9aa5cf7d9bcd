"""Peak memory of the default ``vitscope analyze`` at a high token count, against a bare forward.

A DINOv2-S-sized ``transformers.Dinov2Model`` with random weights (384 wide, 12 blocks, 6 heads, patch 14) at
518 px has 1,370 tokens: one block's attention pattern for a batch of 16 is 720 MB, every block's 8.6 GB. The
engine reduces each pattern the moment the model makes it (docs/architecture.md, "Memory"), so the run should
stay near one block's pattern above a bare forward.

Each measurement runs in a FRESH subprocess (this script re-invoked with ``--child``), so no two share a
high-water mark; the child reports its peak resident set (``ru_maxrss``) in MiB:

* ``bare``: decode the images, preprocess, ``model(pixels)`` with the model's own (sdpa) attention, nothing
  recorded: the floor any tool pays;
* ``analyze``: ``vitscope.analyze`` with the default analyses, nothing written (``out=None``).

Goal (issue 24, item 5): ``analyze`` under 3 GB at the default batch (16). Printed: both peaks, their
difference and ratio, per repeat; the median over repeats.

Run: ``python benchmarks/pattern_memory.py [--images 16] [--batch 16] [--repeats 2]``.
Writes ``benchmarks/results/pattern_memory.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _datasets import RESULTS_DIR, SyntheticImages, cpu_model

MIB = 1024 * 1024
GOAL_MIB = 3 * 1024


def _model_dir(root: Path) -> Path:
    """A DINOv2-S-sized random model saved as a ``save_pretrained`` directory with its preprocessor."""
    import torch
    import transformers as tf

    out = root / "dinov2-s-518"
    if (out / "config.json").exists():
        return out
    torch.manual_seed(0)
    cfg = tf.Dinov2Config(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536,
                          patch_size=14, image_size=518)
    tf.Dinov2Model(cfg).save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "BitImageProcessor", "do_resize": True, "size": {"shortest_edge": 518},
        "do_center_crop": True, "crop_size": {"height": 518, "width": 518}, "do_normalize": True,
        "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], "resample": 3,
        "do_rescale": True, "rescale_factor": 1 / 255}))
    return out


def _child(kind: str, model: str, images: int, batch: int) -> None:
    import torch

    import vitscope

    source = SyntheticImages(images, size=600)
    torch.set_grad_enabled(False)
    if kind == "bare":
        backbone = vitscope.load_model(model)
        for start in range(0, images, batch):
            pixels = backbone.preprocess([source.load(i) for i in range(start, min(images, start + batch))])
            backbone.model(pixel_values=pixels)
    else:
        vitscope.analyze(model, source, out=None, device="cpu", batch_size=batch)
    print(json.dumps({"peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def _measure(kind: str, model: Path, images: int, batch: int) -> float:
    cmd = [sys.executable, __file__, "--child", kind, "--model", str(model), "--images", str(images),
           "--batch", str(batch)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["peak_mib"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", choices=("bare", "analyze"))
    parser.add_argument("--model")
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.model, args.images, args.batch)
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = _model_dir(Path(tmp))
        rounds = []
        for r in range(args.repeats):
            bare = _measure("bare", model, args.images, args.batch)
            full = _measure("analyze", model, args.images, args.batch)
            rounds.append({"bare_mib": bare, "analyze_mib": full, "ratio": full / bare})
            print(f"round {r + 1}: bare forward {bare:.0f} MiB, default analyze {full:.0f} MiB "
                  f"(+{full - bare:.0f} MiB, x{full / bare:.2f})", flush=True)
    median = statistics.median(r["analyze_mib"] for r in rounds)
    print(f"median default analyze peak {median:.0f} MiB; goal under {GOAL_MIB} MiB: "
          f"{'met' if median < GOAL_MIB else 'NOT met'}")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "pattern_memory.json").write_text(json.dumps({
        "images": args.images, "batch": args.batch, "rounds": rounds, "median_analyze_mib": median,
        "goal_mib": GOAL_MIB, "cpu": cpu_model(), "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d")}, indent=2))


if __name__ == "__main__":
    main()
