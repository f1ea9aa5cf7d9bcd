"""CKA of six models: vitscope (each model run once, features cached) vs the ``torch-cka`` package.

The workload (issue 6): six models with the tiny zoo's architecture (``tiny-vit``: 64 px, patch 8, 6
blocks, width 128, 4 heads; random weights, seeds 0..5) over 500 images; the 15 cross-model CKA values
between the final blocks, plus each model's block-by-block self-CKA matrix: 21 matrices. Features are the
flattened block outputs (all tokens, ``resid_post``, what ``torch-cka`` hooks on ``blocks.{i}``), CKA is
the unbiased minibatch estimator over consecutive minibatches of ``--batch`` images (50 divides 500, so
``torch-cka``'s equal weights per minibatch equal vitscope's weights by minibatch size).

- vitscope: per model, one ``extract_features`` pass that caches the final block's features (pooling
  ``"all"``, feature cache in a temporary folder) while a streaming ``BlockCKA`` rides on the same forward
  passes for the self matrix; then ``cross_model_cka`` for the 15 pairs from the six cached final blocks.
- torch-cka (``pip install torch-cka``; it is not a vitscope dependency): ``CKA(m1, m2, layers).compare(dl)``
  for every one of the 21 matrices, which runs both models over the data each time (42 passes), with fresh
  model copies per comparison because the package never removes its hooks.

Both start from the same image generator and the model's own preprocessing (decoded per pass), both decode in
the main process (vitscope ``workers=0``, the DataLoader's ``num_workers=0``). CPU time counts this process and any
child it waited for. ``--repeats`` rounds run the two sides in alternating order. Prints the median times, their
ratio per round (goal: vitscope <= 1/5 of torch-cka) with its spread and the largest difference between the
values, and writes ``benchmarks/results/cka.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
import warnings

os.environ.setdefault("TQDM_DISABLE", "1")  # torch-cka draws a progress bar per comparison

import numpy as np
import torch
from _datasets import RESULTS_DIR, synthetic_image

from vitscope.analyses.representation.cka import BlockCKA, cross_model_cka
from vitscope.cache import FeatureCache, FeatureRequest
from vitscope.data.source import Source
from vitscope.engine.extract import extract_features
from vitscope.models.digest import digest
from vitscope.models.wrap import build_tiny_vit


class GeneratedSource(Source):
    """``n`` synthetic images made from their index (``_datasets.synthetic_image``), no files."""

    def __init__(self, n: int, size: int) -> None:
        super().__init__()
        self.paths, self.name, self.size = [f"synthetic:{i}" for i in range(n)], f"synthetic-{n}", size

    def load(self, i: int):
        return synthetic_image(i, self.size)

    def content_digest(self) -> str:
        return digest({"synthetic": len(self), "size": self.size})


class PixelDataset(torch.utils.data.Dataset):
    """The same images, preprocessed by the model, as a torch Dataset for torch-cka's DataLoader."""

    def __init__(self, n: int, size: int, backbone) -> None:
        self.n, self.size, self.backbone = n, size, backbone

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return (self.backbone.preprocess([synthetic_image(i, self.size)])[0],)


def _cpu_seconds() -> float:
    """CPU time of this process plus its waited-for children (worker processes, should any side start them)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def run_vitscope(models, n: int, size: int, batch: int, cache_root: str) -> tuple[dict, tuple[float, float]]:
    """Values and (wall, CPU) seconds of the vitscope way."""
    cache = FeatureCache(cache_root)
    source = GeneratedSource(n, size)
    request = FeatureRequest(pooling="all", blocks=(-1,))  # the final block, cached for the cross-model pairs
    start, cpu = time.perf_counter(), _cpu_seconds()
    entries, out = {}, {"self": {}, "cross": {}}
    for name, backbone in models.items():
        self_cka = BlockCKA(tokens="all", estimator="minibatch", batch=batch)  # streams on the same pass
        # workers=0: decode in this process like torch-cka's DataLoader (num_workers=0), the same work on one core
        entries[name] = extract_features(backbone, source, [request], cache, batch_size=batch, device="cpu",
                                         analyses=[self_cka], workers=0)[request]
        out["self"][name] = self_cka.compute()["cka"]
    cross = cross_model_cka(entries, block=-1, estimator="minibatch", batch=batch)
    elapsed = (time.perf_counter() - start, _cpu_seconds() - cpu)
    names = list(models)
    out["cross"] = {(a, b): float(cross[i, j]) for (i, a), (j, b) in itertools.combinations(enumerate(names), 2)}
    return out, elapsed


def run_torch_cka(models, n: int, size: int, batch: int) -> tuple[dict, tuple[float, float]]:
    """Values and (wall, CPU) seconds of torch-cka (model copies and the loader are made outside the clock)."""
    from torch_cka import CKA

    loader = torch.utils.data.DataLoader(PixelDataset(n, size, next(iter(models.values()))), batch_size=batch,
                                         shuffle=False)
    blocks = [f"blocks.{i}" for i in range(6)]
    out = {"self": {}, "cross": {}}
    wall = cpu = 0.0
    jobs = [(a, a, blocks) for a in models] + [(a, b, blocks[-1:]) for a, b in itertools.combinations(models, 2)]
    for a, b, layers in jobs:
        m1, m2 = copy.deepcopy(models[a].model), copy.deepcopy(models[b].model)  # fresh hooks each time
        start, start_cpu = time.perf_counter(), _cpu_seconds()
        with warnings.catch_warnings(), torch.inference_mode():  # the package itself runs with autograd on
            warnings.simplefilter("ignore")
            cka = CKA(m1, m2, f"{a}#1", f"{b}#2", layers, layers, device="cpu")
            cka.compare(loader, loader)
        wall += time.perf_counter() - start
        cpu += _cpu_seconds() - start_cpu
        result = cka.export()["CKA"].double()
        if a == b:
            out["self"][a] = result
        else:
            out["cross"][(a, b)] = float(result[0, 0])
    return out, (wall, cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--size", type=int, default=64, help="side of the generated images in pixels")
    parser.add_argument("--batch", type=int, default=50, help="CKA minibatch (and forward batch) size")
    parser.add_argument("--models", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch.set_num_threads (default 1: on a shared machine OpenMP waits distort wall time)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds of both sides, their order alternating (the ratio's spread comes from these)")
    parser.add_argument("--out", default=str(RESULTS_DIR / "cka.json"))
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    models = {f"tiny-vit-s{s}": build_tiny_vit(f"tiny-vit-s{s}", seed=s) for s in range(args.models)}

    def vitscope_side():
        cache_root = tempfile.mkdtemp(prefix="vitscope-cka-bench-")  # a fresh cache: every round extracts anew
        try:
            return run_vitscope(models, args.images, args.size, args.batch, cache_root)
        finally:
            shutil.rmtree(cache_root, ignore_errors=True)

    def torch_cka_side():
        return run_torch_cka(models, args.images, args.size, args.batch)

    rounds = []
    for r in range(args.repeats):
        # alternate which side runs first, so neither always gets the warmer (or the busier) half of a round
        order = [("vitscope", vitscope_side), ("torch_cka", torch_cka_side)]
        got = {name: fn() for name, fn in (order if r % 2 == 0 else order[::-1])}
        (ours, t_ours), (theirs, t_theirs) = got["vitscope"], got["torch_cka"]
        rounds.append({"first": "vitscope" if r % 2 == 0 else "torch_cka",
                       "seconds_wall": {"vitscope": t_ours[0], "torch_cka": t_theirs[0]},
                       "seconds_cpu": {"vitscope": t_ours[1], "torch_cka": t_theirs[1]},
                       "ratio": t_ours[0] / t_theirs[0], "ratio_cpu": t_ours[1] / t_theirs[1]})
        print(f"round {r + 1}/{args.repeats} ({rounds[-1]['first']} first): vitscope {t_ours[0]:.2f} s wall, "
              f"{t_ours[1]:.2f} s CPU; torch-cka {t_theirs[0]:.2f} s wall, {t_theirs[1]:.2f} s CPU; "
              f"ratio {rounds[-1]['ratio']:.3f} wall, {rounds[-1]['ratio_cpu']:.3f} CPU", flush=True)
    diff_self = max(float((ours["self"][m] - theirs["self"][m]).abs().max()) for m in models)
    diff_cross = max(abs(ours["cross"][k] - theirs["cross"][k]) for k in theirs["cross"])

    def med(key: str, side: str | None = None) -> float:
        return statistics.median(x[key][side] if side else x[key] for x in rounds)

    def spread(key: str) -> list[float]:
        return [min(x[key] for x in rounds), max(x[key] for x in rounds)]

    ratio, cpu_ratio = med("ratio"), med("ratio_cpu")
    t_ours = (med("seconds_wall", "vitscope"), med("seconds_cpu", "vitscope"))
    t_theirs = (med("seconds_wall", "torch_cka"), med("seconds_cpu", "torch_cka"))
    print(f"{args.models} models x {args.images} images, minibatch {args.batch}, {torch.get_num_threads()} thread(s): "
          f"{len(theirs['self'])} self-CKA matrices + {len(theirs['cross'])} cross-model values; "
          f"medians of {args.repeats} round(s)")
    print(f"vitscope  : {t_ours[0]:8.2f} s wall, {t_ours[1]:8.2f} s CPU  (each model run once, features cached)")
    print(f"torch-cka : {t_theirs[0]:8.2f} s wall, {t_theirs[1]:8.2f} s CPU  (both models run for each comparison)")
    lo, hi = spread("ratio")
    lo_cpu, hi_cpu = spread("ratio_cpu")
    print(f"ratio     : {ratio:.3f} wall (spread {lo:.3f}-{hi:.3f}), {cpu_ratio:.3f} CPU (spread {lo_cpu:.3f}-"
          f"{hi_cpu:.3f})  (goal <= 0.2)  {'OK' if ratio <= 0.2 else 'MISSED'}")
    print(f"largest |difference|: self-CKA {diff_self:.2e}, cross-model {diff_cross:.2e}")
    doc = {
        "workload": {"models": list(models), "images": args.images, "image_size": args.size,
                     "minibatch": args.batch, "features": "blocks.{i}.resid_post, all tokens flattened",
                     "estimator": "unbiased minibatch linear CKA"},
        "loader": "decoding in the main process on both sides (vitscope workers=0, DataLoader num_workers=0)",
        "repeats": args.repeats,
        "seconds_wall": {"vitscope": t_ours[0], "torch_cka": t_theirs[0]},
        "seconds_cpu": {"vitscope": t_ours[1], "torch_cka": t_theirs[1]},
        "ratio": ratio, "ratio_cpu": cpu_ratio, "ratio_spread": spread("ratio"),
        "ratio_cpu_spread": spread("ratio_cpu"), "goal": 0.2, "rounds": rounds,
        "max_abs_difference": {"self": diff_self, "cross": diff_cross},
        "cross_model_cka": {f"{a}|{b}": v for (a, b), v in ours["cross"].items()},
        "self_cka": {m: ours["self"][m].tolist() for m in models},
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
                    "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None},
        "torch_cka_version": __import__("torch_cka").__version__,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {args.out}")
    if np.isnan(diff_self) or np.isnan(diff_cross):
        sys.exit(1)


if __name__ == "__main__":
    main()
