"""Whole passes on a GPU against plain scripts over the same JPEGs: analyze's attention pass and probe's extraction.

Data: ``--images`` ImageNet-sized JPEGs (500 x 375, quality 90, a smooth ramp plus noise, 16 class folders)
written once to a temporary folder. Model: a ViT-B/16-sized ``transformers.ViTModel`` (768 wide, 12 blocks,
12 heads, 224 px, random weights) saved with ``save_pretrained`` next to a ``ViTImageProcessor`` config that
resizes to 224 x 224, so vitscope and the plain scripts do the same preprocessing.

Timed, round by round in one process (the ways alternate; medians reported), images per second of the pass:

* ``decode_only[w]`` - a ``torch.utils.data.DataLoader`` with ``w`` workers decoding, resizing and batching
  (uint8), no model: the loading ceiling.
* ``plain_forward[w]`` - the same loader, pinned batches copied non-blocking, normalised on the device and a bare
  ``model(pixel_values=x)`` (sdpa) in ``torch.inference_mode``.
* ``vitscope_attention`` - ``vitscope.run`` with the analyses ``vitscope analyze --analyses attention`` picks for
  this data (the pass: no start-up, no writing). The goal (issue 38): >= 0.75 x ``plain_forward`` with the same
  number of workers (vitscope's own loading, with ``workers=`` where ``vitscope.run`` takes it).
* ``vitscope_attention_compiled`` - the same with ``compile_stats=True`` (the shared per-block statistics through
  ``torch.compile``; the warm-up pays the compilation).
* ``vitscope_loader[w]`` - vitscope's own loader alone (``vitscope.engine.batches.iter_batches`` with the
  preprocessing ``vitscope.run`` gives it, pinned pixels on a GPU), no model: its ceiling against
  ``decode_only[w]``. Beside the passes, ``loader_wait`` records the share of each vitscope pass spent waiting for
  decoded images (``Results.loader_seconds / Results.seconds``): near 0, the GPU side sets the pace; near 1, the
  loader does.
* ``plain_extract[w]`` - the plain loader, a forward with every block's output, CLS and spatial-mean rows of
  every block copied to host memory (what a hand-written probe script keeps).
* ``vitscope_extract`` - ``vitscope.engine.extract.extract_features`` of the probe's two requests (CLS and
  spatial mean, every block) into a fresh feature cache. Goal: >= 0.85 x ``plain_extract``.

Run: ``python benchmarks/gpu_pass.py [--images 2048] [--batch-size 64] [--workers 8] [--rounds 2]
[--device cuda] [--out FILE]``. ``benchmarks/gpu.sh`` runs it with every other GPU measurement.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import torch
import transformers
from _datasets import RESULTS_DIR, cpu_model
from _timing import CompileRecord
from PIL import Image

CLASSES = 16
SIDE = 224


def _photo(index: int) -> Image.Image:
    """One deterministic 500 x 375 RGB image: a per-index colour ramp plus noise (JPEG-compressible, not flat)."""
    rng = np.random.default_rng(index)
    h, w = 375, 500
    base = rng.uniform(0, 1, 3).astype(np.float32)
    img = np.empty((h, w, 3), np.float32)
    img[..., 0] = base[0] * np.linspace(0, 1, w, dtype=np.float32)[None, :]
    img[..., 1] = base[1] * np.linspace(0, 1, h, dtype=np.float32)[:, None]
    img[..., 2] = base[2]
    img += rng.normal(0, 0.08, img.shape).astype(np.float32)
    return Image.fromarray((np.clip(img, 0, 1) * 255).astype(np.uint8))


def _write(args: tuple[int, str]) -> None:
    index, root = args
    _photo(index).save(Path(root) / f"c{index % CLASSES:02d}" / f"{index:06d}.jpg", quality=90)


def make_world(root: Path, images: int) -> tuple[Path, Path]:
    """A ViT-B/16-sized model directory and an image folder of ``images`` JPEGs in class folders."""
    torch.manual_seed(0)
    model = root / "vit-b16"
    config = transformers.ViTConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                    intermediate_size=3072, image_size=SIDE, patch_size=16)
    transformers.ViTModel(config, add_pooling_layer=False).save_pretrained(model)
    (model / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "ViTImageProcessor", "do_resize": True, "size": {"height": SIDE, "width": SIDE},
        "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_rescale": True,
        "rescale_factor": 1 / 255, "resample": 2}))
    data = root / "images"
    for c in range(CLASSES):
        (data / f"c{c:02d}").mkdir(parents=True)
    with Pool(min(16, os.cpu_count() or 1)) as pool:
        pool.map(_write, [(i, str(data)) for i in range(images)], chunksize=32)
    return model, data


class Files(torch.utils.data.Dataset):
    """The plain scripts' dataset: decode with PIL, resize to 224 x 224 (bilinear), ``[3, 224, 224]`` uint8."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> torch.Tensor:
        with Image.open(self.files[i]) as im:
            im = im.convert("RGB").resize((SIDE, SIDE), Image.BILINEAR)
        return torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1)


def _loader(files: list[Path], batch_size: int, workers: int, device: str) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(Files(files), batch_size=batch_size, num_workers=workers,
                                       pin_memory=device == "cuda", prefetch_factor=4 if workers else None,
                                       persistent_workers=False)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def decode_only(files, batch_size: int, workers: int, device: str) -> float:
    start = time.perf_counter()
    n = sum(len(b) for b in _loader(files, batch_size, workers, device))
    return n / (time.perf_counter() - start)


@torch.inference_mode()
def plain_forward(model, files, batch_size: int, workers: int, device: str) -> float:
    start, n = time.perf_counter(), 0
    for x in _loader(files, batch_size, workers, device):
        x = x.to(device, non_blocking=True).float().div_(127.5).sub_(1.0)
        model(pixel_values=x)
        n += len(x)
    _sync(device)
    return n / (time.perf_counter() - start)


@torch.inference_mode()
def plain_extract(model, files, batch_size: int, workers: int, device: str) -> float:
    start, n, kept = time.perf_counter(), 0, []
    for x in _loader(files, batch_size, workers, device):
        x = x.to(device, non_blocking=True).float().div_(127.5).sub_(1.0)
        hidden = model(pixel_values=x, output_hidden_states=True).hidden_states[1:]
        rows = torch.stack([torch.cat([h[:, 0], h[:, 1:].mean(1)], -1) for h in hidden], 1)  # [B, L, 2D]
        kept.append(rows.float().cpu().numpy())
        n += len(x)
    _sync(device)
    return n / (time.perf_counter() - start)


def vitscope_loader(backbone, data: str, batch_size: int, workers: int, device: str) -> float:
    from vitscope.data import as_source
    from vitscope.engine.batches import iter_batches
    from vitscope.engine.run import loader_preprocessing

    source, n = as_source(data), 0
    start = time.perf_counter()
    for _, batch in iter_batches(source, batch_size, preprocess=loader_preprocessing(backbone), workers=workers,
                                 pin=device == "cuda"):
        n += len(batch.indices)
    return n / (time.perf_counter() - start)


def _wait(results) -> float | None:
    """The share of a pass spent waiting for the loader (None before ``Results`` measured it)."""
    seconds = getattr(results, "seconds", 0.0)
    return results.loader_seconds / seconds if seconds else None


def _workers_kw(function, workers: int) -> dict:
    """``workers=`` for vitscope's entry points that take it (the loader of issue 38), else nothing."""
    return {"workers": workers} if "workers" in inspect.signature(function).parameters else {}


def vitscope_attention(backbone, data: str, batch_size: int, workers: int, device: str, limit: int | None = None,
                       compile_stats: bool = False) -> tuple[float, dict]:
    import vitscope
    from vitscope.data import as_source
    from vitscope.workflows.analyze import choose_analyses

    source = as_source(data)
    analyses = choose_analyses("attention", backbone.spec, source.target_keys(), None)
    start = time.perf_counter()
    compiled = {"compile_stats": True} if compile_stats else {}
    results = vitscope.run(backbone, source, analyses, batch_size=batch_size, device=device, progress=False,
                           limit=limit, **_workers_kw(vitscope.run, workers), **compiled)
    _sync(device)
    speed = results.num_images / (time.perf_counter() - start)
    return speed, {"analyses": [a.name for a in analyses], "images": results.num_images, "loader_wait": _wait(results)}


def same_numbers(backbone, data: str, batch_size: int, workers: int, device: str) -> dict:
    """One attention pass decoded in ``workers`` processes against one decoded in a thread: every tensor of every
    result must be equal, bit for bit (issue 38: no number depends on the loading)."""
    import vitscope
    from vitscope.data import as_source
    from vitscope.workflows.analyze import choose_analyses

    if "workers" not in inspect.signature(vitscope.run).parameters:
        return {"checked": False}
    source = as_source(data)
    runs = []
    for w in (workers, 0):
        analyses = choose_analyses("attention", backbone.spec, source.target_keys(), None)
        runs.append(vitscope.run(backbone, source, analyses, batch_size=batch_size, device=device, progress=False,
                                 workers=w, limit=512))
    differ = [f"{name}.{key}" for name in runs[1] for key, t in runs[1][name].tensors.items()
              if not torch.equal(torch.nan_to_num(runs[0][name].tensors[key], -7.0), torch.nan_to_num(t, -7.0))]
    return {"checked": True, "images": runs[0].num_images, "workers": [workers, 0], "tensors_differing": differ}


def _checked(check, *args) -> dict:
    """A check's answer, or the error it raised (the timings are written whatever a check does)."""
    try:
        return check(*args)
    except Exception as err:  # reported in the JSON, not raised
        return {"error": f"{type(err).__name__}: {err}"}


def device_vs_cpu(backbone, root: Path, device: str) -> dict:
    """The attention group with object masks (saliency IoU included) over 32 synthetic COCO images on ``device``
    and on the CPU: the largest difference of every result, relative to each tensor's largest value."""
    import vitscope
    from vitscope.data import as_source
    from vitscope.data.synthetic.write import synthesize
    from vitscope.workflows.analyze import choose_analyses

    if device == "cpu" and not os.environ.get("GPU_PASS_CHECK_ON_CPU"):
        return {"checked": False}
    world = synthesize(root / "coco", "coco", n=32, size=SIDE, seed=0)
    source = as_source(f"{world}::coco")
    runs = []
    for where in (device, "cpu"):
        analyses = choose_analyses("attention", backbone.spec, source.target_keys(), None)
        runs.append(vitscope.run(backbone, source, analyses, batch_size=16, device=where, progress=False,
                                 workers=0))
    backbone.to(device)
    worst: dict[str, float] = {}
    for name in runs[1]:
        for key, t in runs[1][name].tensors.items():
            if not t.is_floating_point():
                worst[f"{name}.{key}"] = float((runs[0][name].tensors[key] != t).sum())
                continue
            scale = float(t.abs().nan_to_num(0).max()) or 1.0
            worst[f"{name}.{key}"] = float((runs[0][name].tensors[key] - t).abs().nan_to_num(0).max()) / scale
    top = sorted(worst.items(), key=lambda kv: -kv[1])[:8]
    return {"checked": True, "images": 32, "analyses": list(runs[1]), "largest_relative_differences": top}


def normalisation_on_device(device: str) -> dict:
    """The loader's uint8 pixels normalised on ``device`` against the CPU, for every byte value."""
    import vitscope
    from vitscope.models.preprocess import normalise_pixels

    spec = vitscope.load_model("tiny-vit").spec
    every = torch.arange(256, dtype=torch.uint8).repeat(3, 1).view(1, 3, 16, 16)
    return {"device": device, "equal_to_cpu": bool(torch.equal(normalise_pixels(every.to(device), spec).cpu(),
                                                                normalise_pixels(every, spec)))}


def vitscope_extract(backbone, data: str, batch_size: int, workers: int, device: str, cache_root: Path
                     ) -> tuple[float, float | None]:
    from vitscope.cache.feature_cache import FeatureCache
    from vitscope.cache.request import FeatureRequest
    from vitscope.data import as_source
    from vitscope.engine.extract import extract_features
    from vitscope.engine.run import tally_passes

    source = as_source(data)
    cache = FeatureCache(cache_root / f"cache-{time.monotonic_ns()}")
    requests = [FeatureRequest("resid_post", "cls"), FeatureRequest("resid_post", "spatial_mean")]
    start = time.perf_counter()
    with tally_passes() as passes:
        extract_features(backbone, source, requests, cache, batch_size=batch_size, device=device, resume=False,
                         **_workers_kw(extract_features, workers))
    _sync(device)
    seconds = getattr(passes, "seconds", 0.0)
    return len(source) / (time.perf_counter() - start), (passes.loader_seconds / seconds if seconds else None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=str(RESULTS_DIR / "gpu_pass.json"))
    args = p.parse_args(argv)
    transformers.logging.set_verbosity_error()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import vitscope

    dev, bs, w = args.device, args.batch_size, args.workers
    rounds: list[dict[str, float]] = []
    waits: dict[str, list[float | None]] = {"vitscope_attention": [], "vitscope_attention_compiled": [],
                                            "vitscope_extract": []}
    meta: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        model_dir, data = make_world(root, args.images)
        print(f"{args.images} JPEGs written in {time.perf_counter() - t0:.1f} s", flush=True)
        files = sorted(data.glob("*/*.jpg"))
        model = transformers.ViTModel.from_pretrained(model_dir, add_pooling_layer=False).to(dev).eval()
        backbone = vitscope.load_model(str(model_dir))
        warm = files[: 2 * bs]
        plain_forward(model, warm, bs, 0, dev)  # kernels, allocator, page cache
        vitscope_attention(backbone, str(data), bs, w, dev, limit=2 * bs)
        compiles = "compile_stats" in inspect.signature(vitscope.run).parameters
        if compiles:  # the compilation, once per process, is paid here
            with CompileRecord() as compiling:
                vitscope_attention(backbone, str(data), bs, w, dev, limit=2 * bs, compile_stats=True)
            meta["compile"] = compiling.as_dict()
            print(f"compile_stats: {meta['compile']}", flush=True)
        for r in range(args.rounds):
            row: dict[str, float] = {}
            for workers in sorted({0, w}):
                row[f"decode_only[{workers}]"] = decode_only(files, bs, workers, dev)
                row[f"plain_forward[{workers}]"] = plain_forward(model, files, bs, workers, dev)
                row[f"plain_extract[{workers}]"] = plain_extract(model, files, bs, workers, dev)
            row[f"vitscope_loader[{w}]"] = vitscope_loader(backbone, str(data), bs, w, dev)
            row["vitscope_attention"], ran = vitscope_attention(backbone, str(data), bs, w, dev)
            waits["vitscope_attention"].append(ran.pop("loader_wait"))
            meta.update(ran)
            if compiles:
                row["vitscope_attention_compiled"], ran = vitscope_attention(backbone, str(data), bs, w, dev,
                                                                             compile_stats=True)
                waits["vitscope_attention_compiled"].append(ran["loader_wait"])
            row["vitscope_extract"], wait = vitscope_extract(backbone, str(data), bs, w, dev, root)
            waits["vitscope_extract"].append(wait)
            rounds.append(row)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v:.0f}" for k, v in row.items()) + " images/s; loader wait "
                  + ", ".join(f"{k} {v[-1]:.2f}" for k, v in waits.items() if v and v[-1] is not None), flush=True)
        checks = {"workers_vs_thread": _checked(same_numbers, backbone, str(data), bs, w, dev),
                  "normalisation": _checked(normalisation_on_device, dev),
                  "device_vs_cpu": _checked(device_vs_cpu, backbone, root, dev)}
        print(f"checks: {json.dumps(checks)}", flush=True)
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    same = w if "workers" in inspect.signature(vitscope.run).parameters else 0
    ratios = {
        "attention_vs_plain_same_workers": med["vitscope_attention"] / med[f"plain_forward[{same}]"],
        "attention_vs_plain_workers": med["vitscope_attention"] / med[f"plain_forward[{w}]"],
        **({"attention_compiled_vs_plain_same_workers": med["vitscope_attention_compiled"]
            / med[f"plain_forward[{same}]"]} if "vitscope_attention_compiled" in med else {}),
        "extract_vs_plain_same_workers": med["vitscope_extract"] / med[f"plain_extract[{same}]"],
        "extract_vs_plain_workers": med["vitscope_extract"] / med[f"plain_extract[{w}]"],
    }
    info = {"device": dev, "card": torch.cuda.get_device_name(0) if dev == "cuda" else None,
            "cpu": cpu_model(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "transformers": transformers.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"), "images": args.images,
            "batch_size": bs, "workers": w, "vitscope_workers": same, **meta}
    print(f"\n{info['card'] or info['cpu']}: {args.images} JPEGs 500x375 -> 224, ViT-B/16, batch {bs}; medians of "
          f"{args.rounds} rounds (images/s)")
    for k, v in med.items():
        print(f"  {k:28s} {v:8.0f}")
    for k, v in ratios.items():
        print(f"  {k:36s} x{v:.2f}")
    for k, v in waits.items():
        if v and None not in v:
            print(f"  loader wait of {k:20s} {statistics.median(v):.2f} (rounds {', '.join(f'{x:.2f}' for x in v)})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"info": info, "rounds": rounds, "median": med, "ratios": ratios, "loader_wait": waits,
                               "checks": checks},
                              indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
