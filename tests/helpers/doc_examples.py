"""The code of docs/extending.md as written: its python blocks, and the analyses they register.

The contract suite (tests/contract/test_analysis_contract.py) runs on every analysis the page registers, so
the form the page teaches is the form that is tested.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

from vitscope.analyses import registry as _registry
from vitscope.analyses.base import Analysis
from vitscope.models import family as _family

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def python_blocks(doc: Path = DOC) -> list[str]:
    """The fenced python blocks of ``doc``, in order."""
    return re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)


def snippet(first_line: str, doc: Path = DOC) -> str:
    """The fenced python block of ``doc`` whose first line is ``first_line``."""
    found = [b for b in python_blocks(doc) if b.splitlines()[0].strip() == first_line]
    assert len(found) == 1, f"{doc.name} has {len(found)} blocks starting with {first_line!r}"
    return found[0]


@contextlib.contextmanager
def registries_kept() -> Iterator[None]:
    """Leave the analysis, group and family registries as they were when the block ends."""
    import vitscope.models.families  # noqa: F401  (the built-in families register on import: kept as loaded)

    saved = [(live, dict(view)) for live, view in ((_registry._ANALYSES, _registry.ANALYSES),  # read: loaded
                                                   (_registry._GROUPS, _registry.GROUPS),
                                                   (_family._FAMILIES, _family._FAMILIES))]
    try:
        yield
    finally:
        for live, before in saved:
            live.clear()
            live.update(before)


@functools.cache
def doc_analyses(doc: Path = DOC) -> dict[str, type[Analysis]]:
    """Every analysis the python blocks of ``doc`` register, by name (run once per process, so every test module
    sees the same classes, the ones ``sys.modules`` holds).

    Each block that calls ``register_analysis`` runs as written, as the body of a module of its own (in
    ``sys.modules``, so its classes pickle as a user's module's would); the registries are left as they were.
    """
    found: dict[str, type[Analysis]] = {}
    for number, block in enumerate(python_blocks(doc)):
        if "register_analysis" not in block:
            continue
        module = types.ModuleType(f"_docs_{doc.stem}_block_{number}")
        sys.modules[module.__name__] = module
        with registries_kept():
            before = dict(_registry.ANALYSES)
            exec(compile(block, f"{doc.name} (python block {number})", "exec"), module.__dict__)
            found.update({name: cls for name, cls in _registry._ANALYSES.items() if before.get(name) is not cls})
    return found


@contextlib.contextmanager
def registered(*classes: type[Analysis]) -> Iterator[None]:
    """Register ``classes`` under their names, groups and default flag while the block runs."""
    with registries_kept():
        for cls in classes:
            _registry.register_analysis(cls.name, groups=cls.groups, default=cls.default)(cls)
        yield
