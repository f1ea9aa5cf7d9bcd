"""docs/api.md is the public API: every name in its table imports from where it says, the whole surface of the
facades is in it, ``dir()`` of a facade shows that surface and nothing else, and importing them needs no torch."""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "api.md"
#: modules whose every public name the table lists (the others: the names the documents use)
WHOLE = ("vitscope", "vitscope.models", "vitscope.hooks", "vitscope.engine", "vitscope.errors")
#: the lazy facades: ``dir()`` shows their ``__all__`` (and the root its packages) and nothing else
FACADES = ("vitscope", "vitscope.models", "vitscope.hooks", "vitscope.engine")
NAMES_IN_FACADES = ("TYPE_CHECKING", "Any", "importlib", "annotations", "lazy_exports", "_LAZY")


def table(text: str) -> dict[str, tuple[str, list[str]]]:
    """``{dotted name: (what it is, [where documented, ...])}`` from the rows of the page's table."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`vitscope(\.\w+)*`", cells[0]):
            name = cells[0].strip("`")
            assert name not in rows, f"{name} is listed twice"
            rows[name] = (cells[1], [w.strip() for w in cells[2].split(",")])
    return rows


ROWS = table(DOC.read_text())


def resolve(dotted: str) -> tuple[types.ModuleType, str, object]:
    module_name, _, name = dotted.rpartition(".")
    module = importlib.import_module(module_name)
    return module, name, getattr(module, name)


def test_the_table_is_read() -> None:
    assert len(ROWS) > 50 and "vitscope.load_model" in ROWS and "vitscope.models" in ROWS
    assert table("| `vitscope.x` | function: y | README.md, docstring |\n| name | what | where |") == {
        "vitscope.x": ("function: y", ["README.md", "docstring"])}


@pytest.mark.parametrize("dotted", sorted(ROWS))
def test_every_name_in_the_table_imports_from_where_it_says(dotted: str) -> None:
    module, name, value = resolve(dotted)
    if isinstance(value, types.ModuleType):
        assert value.__name__ == dotted and name in dir(module), f"{dotted}: not a package {module.__name__} shows"
    else:
        assert name in getattr(module, "__all__", ()), f"{dotted}: not in {module.__name__}.__all__"
    assert ROWS[dotted][0], f"{dotted}: say what it is"


@pytest.mark.parametrize("dotted", sorted(ROWS))
def test_every_name_is_documented_where_the_table_says(dotted: str) -> None:
    _, name, value = resolve(dotted)
    for where in ROWS[dotted][1]:
        if where == "docstring":
            assert isinstance(value, (type, types.FunctionType, types.ModuleType)) and inspect.getdoc(value), \
                f"{dotted} has no docstring of its own: name a document"
        else:
            path = ROOT / where
            assert path.is_file() and path != DOC, f"{dotted}: {where} is not a document of the repository"
            assert re.search(rf"(?<!\w){re.escape(name)}(?!\w)", path.read_text()), f"{where} does not mention {name}"


@pytest.mark.parametrize("module_name", WHOLE)
def test_every_public_name_of_the_facades_is_in_the_table(module_name: str) -> None:
    module = importlib.import_module(module_name)
    public = set(module.__all__)
    if module_name in FACADES:  # and the packages its dir() shows
        public |= {n for n in dir(module) if not n.startswith("__")}
    missing = sorted(f"{module_name}.{n}" for n in public if f"{module_name}.{n}" not in ROWS)
    assert not missing, f"add to docs/api.md: {missing}"


@pytest.mark.parametrize("module_name", FACADES)
def test_dir_shows_the_public_surface_only(module_name: str) -> None:
    module = importlib.import_module(module_name)
    shown = [n for n in dir(module) if not (n.startswith("__") and n.endswith("__"))]
    packages = {n for n in shown if isinstance(getattr(module, n), types.ModuleType)}
    assert set(shown) == set(module.__all__) - {"__version__"} | packages, set(shown) ^ set(module.__all__)
    assert not set(shown) & set(NAMES_IN_FACADES) and not any(n.startswith("_") for n in shown)
    assert all(hasattr(module, n) for n in module.__all__)
    if module_name == "vitscope":
        assert {"analyses", "data", "engine", "hooks", "models"} <= packages
        assert "__version__" in dir(module)


def test_the_same_object_under_two_paths() -> None:
    import vitscope

    assert vitscope.models.load_model is vitscope.load_model
    assert vitscope.hooks.tokens_to_grid is vitscope.tokens_to_grid
    assert vitscope.models.Backbone is vitscope.Backbone and vitscope.errors.VitscopeError is vitscope.VitscopeError


def test_importing_the_facades_does_not_import_torch() -> None:
    """``import vitscope`` and ``vitscope --help`` answer at once; so do the facades and their ``dir()``."""
    probe = ("import sys, vitscope, vitscope.models, vitscope.hooks, vitscope.engine, vitscope.interventions\n"
             "for m in (vitscope, vitscope.models, vitscope.hooks, vitscope.engine, vitscope.interventions): dir(m)\n"
             "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr
