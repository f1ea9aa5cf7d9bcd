"""Blocked exact k-NN (``vitscope.functional.knn_search``) against ``faiss.IndexFlatIP`` on the same machine.

Both search ``--n`` (100,000) queries against a bank of ``--n`` rows of ``--dim`` (512) float32 features
(standard normal, seeded) for the ``--k`` (10) largest inner products, with the same number of threads
(``--threads``, default: torch's). Each runs in a FRESH subprocess (this script re-invoked with ``--child``),
so each peak resident set (``ru_maxrss``) is its own; the features are made in the child (seeded, the same
in both). The children write their neighbours to a temporary file and the parent compares them.

Goal (issue 24): vitscope at most 1.2x faiss's time, peak memory under 2 GB, identical neighbours. faiss-cpu
is needed only here (``pip install faiss-cpu``), never by vitscope.

The two sides alternate which runs first, round by round.

Run: ``python benchmarks/knn_search.py [--n 100000] [--dim 512] [--k 10] [--repeats 3] [--out PATH]``.
Writes ``benchmarks/results/knn_search.json`` (``--out``).
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _datasets import RESULTS_DIR, cpu_model

GOAL_RATIO = 1.2
GOAL_PEAK_MIB = 2048


def _features(n: int, dim: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim), dtype=np.float32)


def _child(kind: str, n: int, dim: int, k: int, threads: int, out: str) -> None:
    import torch

    torch.set_num_threads(threads)
    queries, bank = _features(n, dim, 1), _features(n, dim, 2)
    if kind == "faiss":
        import faiss

        faiss.omp_set_num_threads(threads)
        index = faiss.IndexFlatIP(dim)
        index.add(bank)
        start = time.perf_counter()
        _, found = index.search(queries, k)
        seconds = time.perf_counter() - start
    else:
        from vitscope.functional.knn_search import knn_search

        q, b = torch.from_numpy(queries), torch.from_numpy(bank)
        start = time.perf_counter()
        _, idx = knn_search(q, b, k=k)
        seconds = time.perf_counter() - start
        found = idx.numpy()
    np.save(out, found.astype(np.int64))
    print(json.dumps({"seconds": seconds, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def _largest_gap(a: np.ndarray, b: np.ndarray, args: argparse.Namespace) -> float:
    """Over the rows where the two neighbour lists differ: the largest difference, rank by rank, between the
    exact (float64) inner products of the two lists; float32 rounding size means both lists are right."""
    rows = np.flatnonzero((a != b).any(axis=1))
    if rows.size == 0:
        return 0.0
    queries = _features(args.n, args.dim, 1)[rows].astype(np.float64)
    bank = _features(args.n, args.dim, 2)
    gaps = []
    for q, x, y in zip(queries, a[rows], b[rows]):
        sx, sy = bank[x].astype(np.float64) @ q, bank[y].astype(np.float64) @ q
        gaps.append(float(np.abs(np.sort(sx)[::-1] - np.sort(sy)[::-1]).max()))
    return max(gaps)


def _run(kind: str, args: argparse.Namespace, out: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--n", str(args.n), "--dim", str(args.dim), "--k", str(args.k),
           "--threads", str(args.threads), "--neighbours", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS_DIR / "knn_search.json"), help="where the results JSON goes")
    parser.add_argument("--child", choices=("faiss", "vitscope"), help=argparse.SUPPRESS)
    parser.add_argument("--neighbours", help=argparse.SUPPRESS)  # (child) where its neighbour indices go
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.n, args.dim, args.k, args.threads, args.neighbours)
        return
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            # alternate the order, so neither side always runs on the machine the other just warmed or loaded
            runs = {kind: _run(kind, args, Path(tmp) / f"{kind}.npy")
                    for kind in (("faiss", "vitscope") if r % 2 == 0 else ("vitscope", "faiss"))}
            faiss_run, ours = runs["faiss"], runs["vitscope"]
            a, b = np.load(Path(tmp) / "faiss.npy"), np.load(Path(tmp) / "vitscope.npy")
            same_rows = int((a == b).all(axis=1).sum())
            same_sets = int(sum(set(x) == set(y) for x, y in zip(a.tolist(), b.tolist())))
            gap = _largest_gap(a, b, args)
            ratio = ours["seconds"] / faiss_run["seconds"]
            rounds.append({"faiss": faiss_run, "vitscope": ours, "ratio": ratio, "identical_rows": same_rows,
                           "identical_sets": same_sets, "largest_float64_gap": gap})
            print(f"round {r + 1}: faiss {faiss_run['seconds']:.1f} s ({faiss_run['peak_mib']:.0f} MiB), vitscope "
                  f"{ours['seconds']:.1f} s ({ours['peak_mib']:.0f} MiB): x{ratio:.2f}; identical neighbours in "
                  f"{same_rows}/{args.n} rows (same sets in {same_sets}; where they differ, the float64 scores of "
                  f"the two lists differ by at most {gap:.2e} at any rank)", flush=True)
    ratios = [r["ratio"] for r in rounds]
    peak = max(r["vitscope"]["peak_mib"] for r in rounds)
    print(f"median ratio x{statistics.median(ratios):.2f} (spread {min(ratios):.2f}-{max(ratios):.2f}; goal "
          f"<= {GOAL_RATIO}); vitscope peak {peak:.0f} MiB (goal < {GOAL_PEAK_MIB})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "n": args.n, "dim": args.dim, "k": args.k, "threads": args.threads, "rounds": rounds,
        "median_ratio": statistics.median(ratios), "cpu": cpu_model(), "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d")}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
