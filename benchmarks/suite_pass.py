"""Whole passes of the attention suite through ``vitscope.run``: ground truth made in the loading thread or not.

``saliency_iou`` compares attention with the object masks on the token grid; turning each image's masks into
that grid is PIL work (resize, crop, resize). The engine now does it in its loading thread, beside decoding
(``Analysis.target_transforms``); before, ``update`` did it on the main thread, between forwards. This runs
``vitscope.run`` with the attention suite over a synthetic COCO-format set (object masks included), both
ways, alternating round by round in one process, and prints images per second. ViT-B/16-sized
``transformers.ViTModel`` with random weights. Run::

    python benchmarks/suite_pass.py [--images 512] [--batch-size 64] [--device cuda] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _datasets import cpu_model
from recording_overhead import build_model

import vitscope
from vitscope.analyses import attention_suite
from vitscope.analyses.attention.saliency import SaliencyIoU
from vitscope.data.synthetic.write import synthesize


def _pass(backbone, data: str, batch_size: int, device: str, in_loader: bool) -> float:
    suite = attention_suite(backbone.spec, targets={"masks"})
    original = SaliencyIoU.target_transforms
    if not in_loader:
        SaliencyIoU.target_transforms = lambda self, spec: {}  # the ground truth is made in update, as before
    try:
        start = time.perf_counter()
        results = vitscope.run(backbone, data, suite, batch_size=batch_size, device=device, progress=False)
        if device == "cuda":
            torch.cuda.synchronize()
        return results.num_images / (time.perf_counter() - start)
    finally:
        SaliencyIoU.target_transforms = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = synthesize(Path(tmp) / "coco", "coco", n=args.images, size=224, seed=0)
        data = f"{root}::coco"
        backbone = vitscope.wrap(build_model("b", 0), name="ViT-B/16")
        _pass(backbone, data, args.batch_size, args.device, True)  # warm-up: caches, kernels, allocator
        speeds: dict[bool, list[float]] = {True: [], False: []}
        for r in range(args.rounds):
            for in_loader in (False, True):
                speeds[in_loader].append(_pass(backbone, data, args.batch_size, args.device, in_loader))
                print(f"round {r + 1}: ground truth in {'the loader' if in_loader else 'update'}: "
                      f"{speeds[in_loader][-1]:.0f} images/s", flush=True)
    where = cpu_model() + (f", {torch.cuda.get_device_name(0)}" if args.device == "cuda" else "")
    before, after = statistics.median(speeds[False]), statistics.median(speeds[True])
    print(f"\n{where}; {args.images} images, batch {args.batch_size}, {args.device}; attention suite, whole passes")
    print(f"ground truth in update: {before:.0f} images/s; in the loading thread: {after:.0f} images/s "
          f"(x{after / before:.2f})")


if __name__ == "__main__":
    main()
