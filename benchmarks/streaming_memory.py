"""Peak memory of ``vitscope.run`` must not grow with the number of images (streaming analyses).

For every model setting, ``vitscope.run`` with ``AttentionStats()`` + ``MeanActivation()`` is run
over a lazily generated synthetic dataset of ``--small`` (64) and ``--large`` (512) images, each in
a FRESH subprocess (this script re-invoked with ``--child``) so the two runs never share a
high-water mark. The child reports, in MiB:

* ``peak_rss``       - the process's peak resident set size over its whole life (max of ``VmHWM``
                       and ``getrusage(RUSAGE_SELF).ru_maxrss``): the goal metric;
* ``rss_before_run`` - resident set after imports, model construction and dataset creation;
* ``peak_during_run``- ``VmHWM`` after resetting it (``/proc/self/clear_refs``) just before the run
                       (Linux only; otherwise null);
* ``run_growth``     - ``peak_during_run - rss_before_run``: what the run itself added;
* ``rss_at_batch_start`` - VmRSS sampled when the loader starts each batch (a leak shows as a ramp).

Goal (issue 24): ``peak_rss(large) / peak_rss(small) <= 1.05``, glibc's allocator as it is. The ratio of
``run_growth`` is also reported: it excludes the interpreter, torch and the weights and is therefore the stricter view.

Every setting is run twice (``--allocators``): with glibc malloc as configured (``default``, what
users get) and with ``MALLOC_MMAP_THRESHOLD_=1048576`` (``mmap1m``). glibc's default threshold is
dynamic: once a large block has been freed, blocks of that size are served from the heap, where
fragmentation can make RSS creep for a while before it levels off. With a fixed 1 MiB threshold
every large tensor is returned to the OS on free, so a ramp in ``mmap1m`` would be a real leak.

Settings (``--models``): ``tiny-vit`` (``vitscope.load_model("tiny-vit")``, 64 px, batch 16) and
``vit-s`` (a ViT-S/16-sized ``transformers.ViTModel`` with random weights, 224 px, batch 8). Every run loads
its images in a thread of the measured process (``workers=0``), whatever the number of images.

Run: ``python benchmarks/streaming_memory.py [--models tiny-vit,vit-s] [--small 64] [--large 512]``.
Writes ``benchmarks/results/streaming_memory.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _datasets import RESULTS_DIR, SyntheticImages, cpu_model

SETTINGS = {
    "tiny-vit": {"batch_size": 16},
    "vit-s": {"batch_size": 8},
}
GOAL = 1.05  # issue 24: peak for 512 images within 5% of the peak for 64
MIB = 1024 * 1024


# -- child ------------------------------------------------------------------------------------
def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _ru_maxrss_bytes() -> int:
    try:
        import resource
    except ImportError:  # Windows
        return 0
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024  # bytes on macOS, KiB on Linux


def build(model: str):
    import torch

    import vitscope

    torch.manual_seed(0)
    if model == "tiny-vit":
        return vitscope.load_model("tiny-vit")
    if model == "vit-s":
        from transformers import ViTConfig, ViTModel

        config = ViTConfig(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536,
                           image_size=224, patch_size=16)
        return vitscope.wrap(ViTModel(config, add_pooling_layer=False).eval(), name="ViT-S/16 (random)")
    raise ValueError(f"unknown model setting {model!r}; choose from {', '.join(SETTINGS)}")


def child(model: str, n: int, batch_size: int) -> dict:
    import torch

    import vitscope
    from vitscope.analyses import AttentionStats, MeanActivation

    backbone = build(model)
    size = int(backbone.spec.image_size[0])
    trace: list[float] = []

    class Traced(SyntheticImages):
        """Samples VmRSS when the loader starts each batch (the list holds a few floats only)."""

        def load(self, i: int):
            if i % batch_size == 0:
                kib = _status_kib("VmRSS")
                if kib is not None:
                    trace.append(kib / 1024)
            return super().load(i)

    dataset = Traced(n, size=size, seed=0)
    rss_before = _status_kib("VmRSS")
    hwm_before = _status_kib("VmHWM")
    reset = _reset_hwm()
    t0 = time.perf_counter()
    # workers=0 at every size: a worker process decodes (and samples the trace) outside this process's RSS, so the
    # engine's default of a worker from 256 images on would make the large run look smaller than it is.
    results = vitscope.run(backbone, dataset, [AttentionStats(), MeanActivation()], batch_size=batch_size,
                           device="cpu", progress=False, workers=0)
    elapsed = time.perf_counter() - t0
    hwm_run = _status_kib("VmHWM")
    assert results.num_images == n, (results.num_images, n)
    expected = -(-n // batch_size)
    if len(trace) < expected:  # loads ran somewhere else: the peak would not be this process's
        raise SystemExit(f"RSS trace holds {len(trace)} samples for {expected} batches: the images were not loaded "
                         "in the measured process")
    peak = max(_ru_maxrss_bytes(), (hwm_before or 0) * 1024, (hwm_run or 0) * 1024)
    out = {
        "model": model, "spec_name": backbone.spec.name, "num_images": n, "batch_size": batch_size,
        "image_size": size, "seconds": elapsed, "torch_threads": torch.get_num_threads(),
        "peak_rss_mib": peak / MIB,
        "rss_before_run_mib": rss_before / 1024 if rss_before is not None else None,
        "peak_during_run_mib": hwm_run / 1024 if (reset and hwm_run is not None) else None,
        "rss_at_batch_start_mib": [round(x, 1) for x in trace],
    }
    if out["peak_during_run_mib"] is not None and out["rss_before_run_mib"] is not None:
        out["run_growth_mib"] = out["peak_during_run_mib"] - out["rss_before_run_mib"]
    else:
        out["run_growth_mib"] = None
    return out


# -- parent -----------------------------------------------------------------------------------
ALLOCATORS = {
    # what users get: glibc's dynamic mmap threshold (large freed blocks may stay in the heap)
    "default": {},
    # allocator-neutral view: blocks >= 1 MiB always come from mmap and go back to the OS on free
    "mmap1m": {"MALLOC_MMAP_THRESHOLD_": str(1024 * 1024)},
}


def run_child(model: str, n: int, batch_size: int, allocator: str) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--model", model, "--n", str(n),
           "--batch-size", str(batch_size)]
    env = {**os.environ, **ALLOCATORS[allocator]}
    if allocator == "default":
        env.pop("MALLOC_MMAP_THRESHOLD_", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"child {' '.join(cmd[2:])} failed with exit code {proc.returncode}")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit(f"child {' '.join(cmd[2:])} printed no result:\n{proc.stdout}\n{proc.stderr}")


def _mib(x: float | None) -> str:
    return f"{x:.1f}M" if x is not None else "n/a"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny-vit,vit-s", help=f"comma-separated subset of {', '.join(SETTINGS)}")
    p.add_argument("--small", type=int, default=64)
    p.add_argument("--large", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=None, help="override every setting's batch size")
    p.add_argument("--allocators", default="default,mmap1m",
                   help="comma-separated: default (glibc as configured) and/or mmap1m (MALLOC_MMAP_THRESHOLD_=1MiB)")
    p.add_argument("--out", default=str(RESULTS_DIR / "streaming_memory.json"))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.child:
        print(json.dumps(child(args.model, args.n, args.batch_size)), flush=True)
        return 0

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in SETTINGS]
    if bad or not models:
        p.error(f"--models takes a comma-separated subset of {', '.join(SETTINGS)}; got {args.models!r}")
    allocators = [a.strip() for a in args.allocators.split(",") if a.strip()]
    if not allocators or any(a not in ALLOCATORS for a in allocators):
        p.error(f"--allocators takes a comma-separated subset of {', '.join(ALLOCATORS)}; got {args.allocators!r}")
    rows = []
    for model in models:
        bs = args.batch_size or SETTINGS[model]["batch_size"]
        for alloc in allocators:
            runs = {}
            for n in (args.small, args.large):
                print(f"[{model}, malloc {alloc}] {n} images, batch {bs} (fresh subprocess) ...", flush=True)
                runs[n] = r = run_child(model, n, bs, alloc)
                growth = f"{r['run_growth_mib']:.1f} MiB" if r["run_growth_mib"] is not None else "n/a"
                print(f"[{model}, malloc {alloc}] {n} images: peak RSS {r['peak_rss_mib']:.1f} MiB, before run "
                      f"{r['rss_before_run_mib']:.1f} MiB, run growth {growth}, {r['seconds']:.1f} s", flush=True)
            s, l_ = runs[args.small], runs[args.large]
            ratio = _ratio(l_["peak_rss_mib"], s["peak_rss_mib"])
            rows.append({
                "model": model, "allocator": alloc, "allocator_env": ALLOCATORS[alloc], "batch_size": bs,
                "small": s, "large": l_,
                "peak_rss_ratio": ratio,
                "run_growth_ratio": _ratio(l_["run_growth_mib"], s["run_growth_mib"]),
                "goal": GOAL, "meets_goal": ratio is not None and ratio <= GOAL,
            })

    print()
    print(f"Streaming memory: vitscope.run with AttentionStats + MeanActivation, {args.small} vs {args.large} "
          f"images, one fresh process each, {os.cpu_count()} cpu cores ({cpu_model()})")
    head = (f"{'model':10s}{'malloc':>8s}{'batch':>6s}{'peak ' + str(args.small):>11s}{'peak ' + str(args.large):>11s}"
            f"{'ratio':>8s}{'goal':>8s}{'ok':>5s}{'growth ' + str(args.small):>12s}{'growth ' + str(args.large):>12s}"
            f"{'ratio':>8s}")
    print(head)
    print("-" * len(head))
    for r in rows:
        g = r["run_growth_ratio"]
        print(f"{r['model']:10s}{r['allocator']:>8s}{r['batch_size']:>6d}{r['small']['peak_rss_mib']:>10.1f}M{r['large']['peak_rss_mib']:>10.1f}M"
              f"{r['peak_rss_ratio']:>8.3f}{'<=' + format(GOAL, '.2f'):>8s}{('yes' if r['meets_goal'] else 'NO'):>5s}"
              f"{_mib(r['small']['run_growth_mib']):>12s}{_mib(r['large']['run_growth_mib']):>12s}"
              f"{(format(g, '.3f') if g is not None else 'n/a'):>8s}")
    print("peak = process peak RSS (goal metric); growth = peak during the run minus RSS just before it;")
    print("malloc mmap1m = MALLOC_MMAP_THRESHOLD_=1048576 (glibc returns every block >= 1 MiB to the OS on free)")

    import torch
    import transformers

    info = {"small": args.small, "large": args.large, "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "cpu_model": cpu_model()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"info": info, "results": rows}, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
