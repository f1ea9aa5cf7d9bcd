"""Peak memory of the default ``vitscope analyze`` at a high token count, against a bare forward.

A DINOv2-S-sized ``transformers.Dinov2Model`` with random weights (384 wide, 12 blocks, 6 heads, patch 14) at
518 px has 1,370 tokens: one block's attention pattern for a batch of 16 is 720 MB, every block's 8.6 GB. The
engine reduces each pattern the moment the model makes it (docs/architecture.md, "Memory"), so the run should
stay near one block's pattern above a bare forward.

Each measurement runs in a FRESH subprocess (this script re-invoked with ``--child``), so no two share a
high-water mark; the child reports its peak resident set (``ru_maxrss``) in MiB:

* ``bare``: decode the images, preprocess, ``model(pixels)`` with the model's own (sdpa) attention, nothing
  recorded: the floor any tool pays (at the largest batch size);
* ``analyze``: ``vitscope.analyze`` with the default analyses, nothing written (``out=None``), at each batch
  size of ``--batches``.

Goals: ``analyze`` under 3 GB at the default batch (16) (issue 24, item 5), and no higher at a small batch
than at 16 (issue 34: minibatch CKA used to keep the features of batches under 4 images in memory, 6.8 GB at
``-b 2``): ``peak(-b 2) / peak(-b 16) <= 1``. Printed: every peak and those ratios, per repeat; the medians.

Run: ``python benchmarks/pattern_memory.py [--images 16] [--batches 16,2] [--repeats 2] [--out PATH]``.
Writes ``benchmarks/results/pattern_memory.json`` (``--out``).
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
    parser.add_argument("--batches", default="16,2", help="batch sizes, the first is the reference")
    parser.add_argument("--batch", type=int, default=16, help="(child) batch size")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(RESULTS_DIR / "pattern_memory.json"), help="where the results JSON goes")
    parser.add_argument("--child", choices=("bare", "analyze"))
    parser.add_argument("--model")
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.model, args.images, args.batch)
        return
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        model = _model_dir(Path(tmp))
        rounds = []
        for r in range(args.repeats):
            bare = _measure("bare", model, args.images, max(batches))
            peaks = {b: _measure("analyze", model, args.images, b) for b in batches}
            ref = peaks[batches[0]]
            rounds.append({"bare_mib": bare, "analyze_mib": {str(b): p for b, p in peaks.items()},
                           "ratio_to_bare": ref / bare, "ratio_to_first_batch": {str(b): p / ref for b, p in
                                                                                 peaks.items()}})
            shown = ", ".join(f"-b {b}: {p:.0f} MiB (x{p / ref:.2f} of -b {batches[0]})" for b, p in peaks.items())
            print(f"round {r + 1}: bare forward {bare:.0f} MiB; default analyze {shown}", flush=True)
    medians = {b: statistics.median(r["analyze_mib"][str(b)] for r in rounds) for b in batches}
    met = all(m < GOAL_MIB for m in medians.values()) and all(m <= medians[batches[0]] for m in medians.values())
    print("median default analyze peaks: " + ", ".join(f"-b {b} {m:.0f} MiB" for b, m in medians.items())
          + f"; goals (under {GOAL_MIB} MiB, no higher than -b {batches[0]}): {'met' if met else 'NOT met'}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "images": args.images, "batches": batches, "rounds": rounds,
        "median_analyze_mib": {str(b): m for b, m in medians.items()}, "goal_mib": GOAL_MIB, "cpu": cpu_model(),
        "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
