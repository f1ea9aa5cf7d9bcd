"""docs/errors.md and tests/badinput/ describe the same bad inputs: every row has its test, every test its row."""

from __future__ import annotations

import ast
import re
from pathlib import Path

HERE = Path(__file__).parent
DOC = HERE.parents[1] / "docs" / "errors.md"


def _rows() -> list[str]:
    return re.findall(r"^\| `([a-z0-9-]+)` \|", DOC.read_text(), flags=re.MULTILINE)


def _tests() -> list[str]:
    names = []
    for path in sorted(HERE.glob("test_bad_*.py")):
        names += [node.name for node in ast.parse(path.read_text()).body
                  if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]
    return names


def test_every_row_has_a_test_and_every_test_a_row():
    rows, tests = _rows(), _tests()
    assert len(rows) >= 30 and len(set(rows)) == len(rows)
    as_test = {row: "test_" + row.replace("-", "_") for row in rows}
    missing = [row for row, name in as_test.items() if name not in tests]
    assert not missing, f"rows of docs/errors.md without a test in tests/badinput: {missing}"
    orphans = [t for t in tests if not any(t == name or t.startswith(name + "_") for name in as_test.values())]
    assert not orphans, f"tests in tests/badinput without a row in docs/errors.md: {orphans}"
