"""Cost of explaining retrieval results with paired similarity maps, relative to embedding the gallery.

A gallery of G held-out synthetic images (64 px, the zoo's test world) is encoded once by
``PairedSimilarity.encode`` (forward pass, embedding parts, rollout matrices). Then every image queries the
gallery (leave-one-out) and is explained against its top-k by ``explain_retrieval``: a cosine top-k and the
maps from the cache, with no forward pass. Reported per model, all measured in this one run:

* ``encode_s``    - encoding the gallery (the denominator), and ``embed_only_s`` (forward, no rollout).
* ``explain_s``   - explaining the top-k of all G queries (G * k pairs) from the cache.
* ``maps_per_s``  - maps per second after embedding (each pair gives two maps; counted as pairs).
* ``explain_over_encode`` - ``explain_s / encode_s``.
* ``naive_over_cached``   - the per-pair cost of ``PairedSimilarity.explain`` on the two images (two forward
  passes per pair, timed on ``--naive-pairs`` pairs, at most half the gallery) divided by the per-pair cost from
  the cache.

Every number is the median of ``--repeats`` rounds, interleaved so drifts in machine speed hit all alike.
Run: ``python benchmarks/explain_pairs.py [--gallery 512] [--k 4] [--models tiny-vit-metric,tiny-resnet-metric]``.
Writes ``benchmarks/results/explain_pairs.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import vitscope
from vitscope.explain import PairedSimilarity, explain_retrieval
from vitscope.train.data import synthetic_split
from vitscope.zoo.heldout import HELDOUT_OFFSET


def _time(fn, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gallery", type=int, default=512)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--models", default="tiny-vit-metric,tiny-vit-metric-p16,tiny-resnet-metric")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--naive-pairs", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "explain_pairs.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = synthetic_split(args.gallery, HELDOUT_OFFSET, size=64)
    explainers = {}
    for name in args.models.split(","):
        backbone = vitscope.load_model(name)
        explainers[name] = PairedSimilarity(backbone, projection="head", batch_size=128)
    rounds: dict[str, dict[str, list[float]]] = {n: {"encode": [], "embed": [], "explain": [], "naive": []}
                                                 for n in explainers}
    # the naive pairs are disjoint halves of the gallery, so a small gallery caps their number
    naive_pairs = min(args.naive_pairs, args.gallery // 2)
    if naive_pairs < 1:
        parser.error("--gallery must hold at least 2 images and --naive-pairs be at least 1")
    naive_a, naive_b = data.images[:naive_pairs], data.images[naive_pairs:2 * naive_pairs]
    for _ in range(args.repeats):
        for name, ps in explainers.items():
            r = rounds[name]
            seconds, gallery = _time(ps.encode, data.images)
            r["encode"].append(seconds)
            r["embed"].append(_time(ps.embed, data.images)[0])
            r["explain"].append(_time(explain_retrieval, ps, gallery, data.instances, k=args.k)[0])
            r["naive"].append(_time(ps.explain, naive_a, naive_b)[0])
    report = {"gallery": args.gallery, "k": args.k, "threads": args.threads, "repeats": args.repeats,
              "naive_pairs": naive_pairs, "models": {}}
    for name, r in rounds.items():
        med = {key: statistics.median(v) for key, v in r.items()}
        pairs = args.gallery * args.k
        cached_per_pair, naive_per_pair = med["explain"] / pairs, med["naive"] / naive_pairs
        report["models"][name] = {
            "encode_s": med["encode"], "embed_only_s": med["embed"], "explain_s": med["explain"],
            "maps_per_s": pairs / med["explain"], "explain_over_encode": med["explain"] / med["encode"],
            "naive_over_cached": naive_per_pair / cached_per_pair, "rounds": r,
        }
        print(f"{name:22s} encode {med['encode']:.2f}s (embed only {med['embed']:.2f}s), explain top-{args.k} of "
              f"{args.gallery} queries {med['explain']:.3f}s -> {pairs / med['explain']:.0f} pairs/s, "
              f"explain/encode {med['explain'] / med['encode']:.3f}, naive/cached per pair "
              f"{naive_per_pair / cached_per_pair:.0f}x")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"-> {out}")


if __name__ == "__main__":
    main()
