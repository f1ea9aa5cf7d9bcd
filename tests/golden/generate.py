"""Rewrite the golden fixtures: ``python -m golden.generate [NAME ...]`` from ``tests/`` (all runs by default).

Only when a number moves on purpose; the commit says why.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from golden.execute import run_golden, write_data
from golden.runs import FIXTURES, RUNS


def main(names: list[str]) -> None:
    chosen = [r for r in RUNS if not names or r.name in names]
    with tempfile.TemporaryDirectory() as tmp:
        roots = write_data(Path(tmp), {k for r in chosen for k in r.data})
        for run in chosen:
            start = time.perf_counter()
            doc = run_golden(run, roots, Path(tmp) / run.name)
            FIXTURES.mkdir(exist_ok=True)
            (FIXTURES / f"{run.name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
            print(f"{run.name}: {time.perf_counter() - start:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
