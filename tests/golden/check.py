"""Check every golden run, the slow ones too: ``python -m golden.check [NAME ...]`` from ``tests/``.

``make golden`` runs it (the full demo takes about two minutes on two cores); ``make test`` checks the quick
runs only. Exits 1 and lists what moved when a number differs from its fixture by more than
its tolerance (1e-6; 1e-5 for the default CNN run, see ``golden.compare``).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from golden.compare import differences
from golden.execute import run_golden, write_data
from golden.runs import RUNS, fixture
from golden.strict import not_json


def main(names: list[str]) -> int:
    chosen = [r for r in RUNS if not names or r.name in names]
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        roots = write_data(Path(tmp), {k for r in chosen for k in r.data})
        for run in chosen:
            start = time.perf_counter()
            found = differences(fixture(run.name), run_golden(run, roots, Path(tmp) / run.name),
                                allow_extra=True, rtol=run.tolerance, atol=run.tolerance)
            found += [f"not JSON: {line}" for line in not_json(Path(tmp) / run.name)]
            took = time.perf_counter() - start
            print(f"{run.name}: {'same numbers' if not found else 'MOVED'} ({took:.1f} s)")
            for line in found:
                print(f"  {line}")
            failed += bool(found)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
