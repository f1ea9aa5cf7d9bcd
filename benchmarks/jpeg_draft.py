"""Decoding JPEGs far larger than the model's input in full or drafted (``jpeg_draft``: libjpeg's DCT scaling),
images per second of decode + preprocess to 224 px, and how far the drafted inputs are from the full ones.

Data: ``--images`` JPEGs of ``--size`` (default 2048 x 1536, a camera photo; a ramp plus noise, quality 90) and the
ViT-B/16 model directory of ``gpu_pass.make_world`` (its preprocessor resizes to 224 x 224). The loader is
``vitscope.engine.batches.iter_batches`` with the preprocessing ``vitscope.run`` gives it, in one thread
(``workers=0``), decoding inside ``vitscope.engine.decoding.decoding`` as ``vitscope.run`` does. Full and drafted
alternate round by round; medians, spread and the ratio drafted / full are printed. ImageNet-sized JPEGs
(500 x 375) gain nothing at 224 px: no DCT scale of theirs still covers 224 (``--size 500x375`` shows it).

Run: ``python benchmarks/jpeg_draft.py [--images 64] [--size 2048x1536] [--rounds 3]``.
Writes ``benchmarks/results/jpeg_draft.json``.
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

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _datasets import RESULTS_DIR, cpu_model
from gpu_pass import make_world


def _photos(folder: Path, images: int, width: int, height: int) -> None:
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:height, 0:width]
    for i in range(images):
        base = np.stack([(x * (i + 1)) % 256, (y * 3 + i) % 256, (x + y) % 256], axis=-1)
        noisy = base + rng.normal(0, 12, size=base.shape)
        Image.fromarray(noisy.clip(0, 255).astype(np.uint8)).save(folder / f"{i:04d}.jpg", quality=90)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=64)
    p.add_argument("--size", default="2048x1536")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=str(RESULTS_DIR / "jpeg_draft.json"))
    args = p.parse_args(argv)
    width, height = (int(v) for v in args.size.split("x"))
    import vitscope
    from vitscope.data import as_source
    from vitscope.engine.batches import iter_batches
    from vitscope.engine.decoding import decoding
    from vitscope.engine.run import loader_preprocessing

    speeds: dict[str, list[float]] = {"full": [], "jpeg_draft": []}
    pixels: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, _ = make_world(Path(tmp), 0)
        data = Path(tmp) / "photos"
        data.mkdir()
        _photos(data, args.images, width, height)
        backbone = vitscope.load_model(str(model_dir))
        source = as_source(str(data))
        preprocess = loader_preprocessing(backbone)
        for r in range(args.rounds):
            for way in speeds:
                start, kept = time.perf_counter(), []
                with decoding(backbone, way == "jpeg_draft"):
                    for _, batch in iter_batches(source, args.batch_size, preprocess=preprocess, workers=0):
                        kept.append(batch.pixels.numpy())
                speeds[way].append(args.images / (time.perf_counter() - start))
                pixels[way] = np.concatenate(kept).astype(np.int16)
            print(f"round {r + 1}: " + ", ".join(f"{w} {v[-1]:.1f}" for w, v in speeds.items()) + " images/s",
                  flush=True)
    med = {w: statistics.median(v) for w, v in speeds.items()}
    ratio = med["jpeg_draft"] / med["full"]
    diff = np.abs(pixels["jpeg_draft"] - pixels["full"])
    print(f"\n{cpu_model()}, {len(os.sched_getaffinity(0))} CPUs; {args.images} JPEGs {width}x{height} -> 224, "
          f"one thread; medians of {args.rounds} rounds")
    for w in speeds:
        print(f"  {w:10s} {med[w]:7.1f} images/s (rounds {min(speeds[w]):.1f}-{max(speeds[w]):.1f})")
    print(f"  drafted / full: x{ratio:.2f}; model inputs differ by {diff.mean():.2f} grey levels on average "
          f"(largest {int(diff.max())}, of 255)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpu": cpu_model(), "cpus": len(os.sched_getaffinity(0)),
                               "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
                               "images": args.images, "size": [width, height], "rounds": speeds, "median": med,
                               "ratio": ratio, "mean_abs_difference": float(diff.mean()),
                               "max_abs_difference": int(diff.max())}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
