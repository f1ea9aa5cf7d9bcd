"""``kill -9`` at random points of ``analyze``, ``compare`` and ``probe``, then the same command.

For each command: one uninterrupted run into its own folder (wall time ``T``); then, ``--points`` times, the
same command into a fresh folder, killed with SIGKILL after a seeded random delay in ``(0.35 T, 0.98 T)`` (past
the start-up: some kills land in the pass, some while outputs are written), then run again. Checked at every point:

* right after the kill, every file under the output folder with a final name is whole (JSON parses, the report
  ends with ``</html>``, CSV and NPZ files load, saved state loads); temporary files and staging folders of
  the killed process may remain;
* the rerun exits 0, leaves no temporary file or staging folder, and its ``results.json`` numbers (``analyses``,
  and ``best_blocks`` for probe) equal the uninterrupted run's exactly.

The data is a synthetic COCO world (and its class folders for ``probe``) written once; the model is the
built-in ``tiny-vit`` (and ``tiny-vit-p16`` for ``compare``); one thread per process.

Run: ``python benchmarks/kill_matrix.py [--points 5] [--images 256] [--seed 0] [--out PATH]``.
Writes ``benchmarks/results/kill_matrix.json`` (``--out``); exits 1 when any point fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _datasets import RESULTS_DIR

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
LEFTOVER_MARKS = (".tmp", ".staging-")


def commands(world: Path, folders: Path, cache: Path) -> dict[str, list[str]]:
    """Each command's arguments without ``--out`` (a fresh cache folder is made per run for ``probe``)."""
    common = ["-b", "4", "--device", "cpu"]
    return {
        "analyze": ["analyze", "-m", "tiny-vit", "-d", f"{world}::coco", "-a", "attention_distance,cka,knn_probe",
                    "--checkpoint-seconds", "0", *common],
        "compare": ["compare", "-M", "tiny-vit,tiny-vit-p16", "-d", f"{world}::coco", "--checkpoint-seconds", "0",
                    *common],
        "probe": ["probe", "-m", "tiny-vit", "-d", f"{folders}::imagefolder", "--cache", str(cache), *common],
    }


def run(args: list[str], out: Path, kill_after: float | None = None) -> tuple[int, float, str]:
    """Run ``vitscope ARGS --out OUT``; with ``kill_after``, SIGKILL it after that many seconds."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "vitscope.cli", *args, "--out", str(out)], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if kill_after is None:
        _, err = proc.communicate()
        return proc.returncode, time.monotonic() - start, err
    try:
        proc.wait(timeout=kill_after)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate()
    return proc.returncode, time.monotonic() - start, err


def whole_files(out: Path) -> list[str]:
    """Files with a final name that do not read back whole (empty when all do)."""
    import numpy as np
    import pandas as pd
    import torch

    broken = []
    for path in out.rglob("*"):
        if not path.is_file() or any(mark in str(path.relative_to(out)) for mark in LEFTOVER_MARKS):
            continue
        try:
            if path.suffix == ".json":
                json.loads(path.read_text())
            elif path.suffix == ".html":
                assert path.read_text().rstrip().endswith("</html>")
            elif path.suffix == ".csv":
                pd.read_csv(path)
            elif path.suffix == ".npz":
                with np.load(path) as arrays:
                    [arrays[k] for k in arrays.files]
            elif path.suffix == ".pt":
                torch.load(path, weights_only=True)
        except Exception as err:  # any failure to read back is what this looks for
            broken.append(f"{path.relative_to(out)}: {type(err).__name__}")
    return broken


def numbers(out: Path) -> dict[str, Any]:
    doc = json.loads((out / "results.json").read_text())
    return {"analyses": doc.get("analyses"), "best_blocks": doc.get("best_blocks")}


def build_world(root: Path, images: int) -> tuple[Path, Path]:
    """A COCO world and the same images as class folders (for the labelled probes)."""
    from vitscope.data.synthetic.write import synthesize

    world = synthesize(root / "coco", "coco", n=images, size=64, seed=0)
    folders = synthesize(root / "folders", "imagefolder", n=images, size=64, seed=0, num_classes=4)
    return world, folders


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=5, help="kill points per command")
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--commands", default="analyze,compare,probe")
    parser.add_argument("--out", default=str(RESULTS_DIR / "kill_matrix.json"), help="where the results JSON goes")
    opts = parser.parse_args()
    rng = random.Random(opts.seed)
    rows, failures = [], 0
    with tempfile.TemporaryDirectory(prefix="vitscope-kill-") as tmp:
        root = Path(tmp)
        world, folders = build_world(root, opts.images)
        for name in opts.commands.split(","):
            args = commands(world, folders, root / f"cache-{name}-clean")[name]
            code, total, err = run(args, root / f"{name}-clean")
            if code != 0:
                raise SystemExit(f"{name}: the uninterrupted run failed:\n{err}")
            expected = numbers(root / f"{name}-clean")
            print(f"{name}: uninterrupted run {total:.1f} s")
            for point in range(opts.points):
                out, cache = root / f"{name}-{point}", root / f"cache-{name}-{point}"
                args = commands(world, folders, cache)[name]
                delay = rng.uniform(0.35, 0.98) * total  # start-up (imports, model) is the first third
                code, _, _ = run(args, out, kill_after=delay)
                killed = code == -signal.SIGKILL
                broken = whole_files(out) if out.exists() else []
                leftovers = sorted(str(p.relative_to(out)) for p in out.rglob("*")
                                   if any(m in p.name for m in LEFTOVER_MARKS)) if out.exists() else []
                code, rerun, err = run(args, out)
                resumed = next((line for line in err.splitlines() if "resum" in line), "")
                after = [str(p.relative_to(out)) for p in out.rglob("*") if any(m in p.name for m in LEFTOVER_MARKS)]
                equal = code == 0 and numbers(out) == expected
                ok = equal and not broken and not after
                failures += not ok
                rows.append({"command": name, "point": point, "kill_after_s": round(delay, 2), "killed": killed,
                             "broken_after_kill": broken, "leftovers_after_kill": len(leftovers),
                             "rerun_exit": code, "rerun_s": round(rerun, 2), "resumed": resumed,
                             "leftovers_after_rerun": after, "numbers_equal": equal, "ok": ok})
                print(f"  kill at {delay:5.1f} s ({'killed' if killed else 'had finished'}): "
                      f"{len(broken)} broken, {len(leftovers)} leftovers; rerun {rerun:.1f} s "
                      f"{'equal' if equal else 'DIFFERENT'}{'; ' + resumed if resumed else ''}"
                      f"{'' if ok else '  <-- FAIL'}")
                shutil.rmtree(out, ignore_errors=True)
    out = Path(opts.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"points": rows, "failures": failures}, indent=1))
    print(f"{len(rows)} kill points, {failures} failed; wrote {out}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
