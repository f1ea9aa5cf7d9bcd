"""The house has floors: no package imports one on its own floor or above, and no modules import in a circle.

The floors are read from the layer table of docs/architecture.md, so the documentation and the code cannot
drift apart. Every import counts, the ones inside functions and under ``TYPE_CHECKING`` too: a lazy import
is still a dependency.
"""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "vitscope"
DOC = ROOT / "docs" / "architecture.md"


def floors_from_doc(text: str) -> dict[str, int]:
    """``{package or top-level module: floor}`` from the ``floor  packages  ...`` table of the doc."""
    block = text.split("```text\n floor", 1)[1].split("```", 1)[0]
    floors = {}
    for line in block.splitlines()[1:]:  # `` 7   workflows/ explain/ featviz/   what lives there``
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) > 1 and cells[0].isdigit():
            for name in cells[1].split():
                floors[name.rstrip("/").removesuffix(".py")] = int(cells[0])
    return floors


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The vitscope modules ``path`` imports (``from a import b`` names module ``a.b`` when that is one).

    A package's ``__init__`` that imports its own submodules (``from a import b`` inside ``a``) does not
    import itself.
    """
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules}
    return {m for m in found if m in modules} - {module_name(path)}


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: imports_of(path, set(files)) for name, path in files.items()}


def top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_the_layer_table_reads_as_floors():
    floors = floors_from_doc(DOC.read_text())
    assert floors["functional"] == 1 and floors["cli"] > floors["engine"] > floors["analyses"] > floors["models"]


def upward_imports(graph: dict[str, set[str]], floors: dict[str, int]) -> list[str]:
    """Every import that does not go down a floor (the package root, a lazy facade, is left out)."""
    return sorted(f"{m} -> {t} (floor {floors[top(m)]} -> {floors[top(t)]})"
                  for m, targets in graph.items() if top(m) != "__init__"
                  for t in targets if top(t) not in (top(m), "__init__") and floors[top(t)] >= floors[top(m)])


def circle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of ``graph`` (empty when there is none)."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return list(error.args[1])
    return []


def test_every_package_has_a_floor_and_imports_only_floors_below():
    floors = floors_from_doc(DOC.read_text())
    graph = import_graph()
    packages = {top(m) for m in graph} - {"__init__"}  # the package root is the lazy facade over everything
    assert packages <= floors.keys(), f"give these a floor in docs/architecture.md: {sorted(packages - floors.keys())}"
    upward = upward_imports(graph, floors)
    assert not upward, "imports that do not go down a floor:\n" + "\n".join(upward)
    assert not any(top(t) == "__init__" for m, ts in graph.items() for t in ts), "only users import the root facade"


def test_no_modules_import_each_other_in_a_circle():
    found = circle(import_graph())
    assert not found, f"import circle: {' -> '.join(found)}"


def test_the_checks_can_fail():
    floors = floors_from_doc("```text\n floor  packages  what\n  2   engine/  a  loop\n  1   data/    ground\n```")
    assert floors == {"engine": 2, "data": 1}
    planted = {"vitscope.data.files": {"vitscope.engine.run"}, "vitscope.engine.run": {"vitscope.data.files"}}
    assert upward_imports(planted, floors) == ["vitscope.data.files -> vitscope.engine.run (floor 1 -> 2)"]
    assert set(circle(planted)) == set(planted)
