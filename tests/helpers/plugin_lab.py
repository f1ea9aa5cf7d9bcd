"""docs/extending.md's plug-in layout in a temporary working directory: ``my_lab/token_norm.py`` (the doc's
module, as written) and ``photos/``; the registry and the imported modules are restored afterwards."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from helpers.images import random_pngs
from helpers.registry import kept_registry

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def fenced(language: str, first_line: str) -> str:
    """The block of the doc in ``language`` whose first line is ``first_line``."""
    blocks = re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)
    found = [b for b in blocks if b.splitlines()[0].strip() == first_line]
    assert len(found) == 1, f"docs/extending.md has {len(found)} {language} blocks starting with {first_line!r}"
    return found[0]


@contextmanager
def doc_lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The doc's layout, as the working directory: ``my_lab/token_norm.py`` (the doc's module) and ``photos/``."""
    (tmp_path / "my_lab").mkdir()
    (tmp_path / "my_lab" / "__init__.py").write_text("")
    (tmp_path / "my_lab" / "token_norm.py").write_text(fenced("python", "# my_lab/token_norm.py"))
    random_pngs(tmp_path / "photos", [(40, 48)] * 4)
    monkeypatch.chdir(tmp_path)
    with kept_registry(tmp_path):
        yield tmp_path
