"""Display names of compared models: ``--models dino=PATH,vit=PATH`` (or a mapping name -> model).

An entry ``NAME=MODEL`` names its model when ``NAME`` is a plain name: a letter or ``_`` first, then letters,
digits, ``_``, ``-`` or ``.``; the entry is split at its first ``=``. Any other entry is the model itself and
is shown under that text: ``hf:org/model=v2`` or ``./runs/a=b`` (the part before ``=`` is not a
plain name) stay whole. A model whose own path starts with a plain name and ``=`` (a folder ``a=b``) is
written ``./a=b`` or ``NAME=a=b``. Names appear in legends, tables, chart series, report headings and
results.json, and must be unique.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from vitscope.errors import VitscopeUsageError, VitscopeValueError

__all__ = ["NAME", "file_safe", "named_models"]

#: what may stand before ``=`` as a display name
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def _split(entry: str) -> tuple[str, str]:
    """``"dino=PATH"`` -> ``("dino", "PATH")``; an entry without a plain name before ``=`` -> ``(entry, entry)``."""
    name, eq, model = entry.partition("=")
    name, model = name.strip(), model.strip()
    if not eq or not NAME.fullmatch(name):
        return entry.strip(), entry.strip()
    if not model:
        raise VitscopeValueError(f"--models entry {entry!r} names no model after '='; write NAME=MODEL, e.g. "
                                 "dino=hf:facebook/dinov2-small")
    return name, model


def named_models(models: Sequence[str] | Mapping[str, str]) -> list[tuple[str, str]]:
    """``(display name, model)`` of every compared model, in order.

    Args:
        models: entries ``MODEL`` or ``NAME=MODEL`` (see the module docstring), or a mapping name -> model.

    Raises:
        VitscopeValueError: fewer than two models, a name given twice, an entry with nothing after ``=``.
    """
    if isinstance(models, Mapping):
        pairs = [(str(name).strip(), str(model).strip()) for name, model in models.items()]
        if any(not name or not model for name, model in pairs):
            raise VitscopeValueError("every compared model needs a non-empty name and model")
    else:
        pairs = [_split(str(entry)) for entry in models]
    if len(pairs) < 2:
        raise VitscopeUsageError("compare needs at least two models, e.g. --models tiny-vit-sup,tiny-vit-mae")
    names = [name for name, _ in pairs]
    for name in dict.fromkeys(n for n in names if names.count(n) > 1):
        if all(n != name or m == name for n, m in pairs):  # plain entries: the same model twice
            raise VitscopeValueError(f"model {name!r} is listed twice in --models; list each model once, or give "
                                     f"each its own name (a={name},b={name})")
        raise VitscopeValueError(f"two models are named {name!r} in --models; give each its own name (NAME=MODEL)")
    files = [file_safe(name) for name in names]  # the names of a model's files and state
    for i, safe in enumerate(files):
        if safe in files[:i]:
            raise VitscopeValueError(f"models {names[files.index(safe)]!r} and {names[i]!r} would share file names "
                                     f"({safe!r}); rename one")
    return pairs


def file_safe(name: str) -> str:
    """A display name as a file-name part (``hf:org/model`` -> ``hf_org_model``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"
