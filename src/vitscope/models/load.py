"""``vitscope.load_model``: one entry point for registered names, hub ids, directories and checkpoints."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from vitscope.models.backbone import Backbone
from vitscope.models.errors import ModelLoadError
from vitscope.models.registry import registry


class UnknownModelError(ModelLoadError):
    """A name that is not registered, not a hub id (``hf:...``) and not a directory."""


def load_model(name: str | os.PathLike, device: str | None = None, image_size: int | tuple[int, int] | None = None,
               keep_aspect: bool = False) -> Backbone:
    """Load a model by name and return its Backbone (in eval mode).

    Its preprocessing comes from the checkpoint's ``preprocessor_config.json``, else the family's defaults at the
    size in ``config.json``; a registered alias sets the paper's settings instead. ``backbone.spec.preprocessing``
    says which.

    Args:
        name: a registered name (``vitscope models``), ``hf:<hub id or local dir>``, a local
            ``save_pretrained`` directory, or a vitscope checkpoint directory (``vitscope.json``); a directory may
            be given as a ``Path``.
        device: optional device to move the model to.
        image_size: run the model on ``image_size x image_size`` (or ``(H, W)``) inputs instead: the resize, the
            crop and the token grid follow, position embeddings are interpolated
            (:func:`vitscope.models.input_size.with_image_size`).
        keep_aspect: resize every image at its own aspect ratio, with at most the patches of the (square) input,
            and no crop (:func:`vitscope.models.input_size.keeping_aspect`): images get grids of their own.

    Raises:
        UnknownModelError: the name is unknown; the message suggests the closest names.
        ModelLoadError: the model exists but cannot be loaded (offline, broken directory...).
        VitscopeValueError: ``image_size`` does not suit the model (not a multiple of its patch size...).
        VitscopeTypeError: ``name`` is neither a string nor a path.
    """
    if isinstance(name, os.PathLike):
        name = os.fspath(name)
    if not isinstance(name, str):
        from vitscope.errors import VitscopeTypeError

        raise VitscopeTypeError(f"a model is named by a string or a directory's path, got {type(name).__name__}")
    backbone = _load(name)
    if image_size is not None:
        from vitscope.models.input_size import with_image_size

        backbone = with_image_size(backbone, image_size)
    if keep_aspect and not backbone.spec.max_tokens:  # NaFlex models keep it anyway
        from vitscope.models.input_size import keeping_aspect

        backbone = keeping_aspect(backbone)
    backbone.eval()
    return backbone.to(device) if device else backbone


def _load(name: str) -> Backbone:
    reg = registry()
    if name in reg:
        entry = reg[name]
        if entry.builder is not None:
            return entry.builder()
        from vitscope.models.hf_load import load_hf

        overrides = {**entry.preprocessing, "preprocessing": f"alias {name} (the settings of its paper)"} \
            if entry.preprocessing else None
        return load_hf(entry.hub_id, name=name, overrides=overrides)
    if name.startswith("hf:"):
        from vitscope.models.hf_load import load_hf

        return load_hf(name[3:], name=name)
    path = Path(name)
    if (path / "vitscope.json").is_file():
        from vitscope.models.checkpoint import load_checkpoint

        return load_checkpoint(path)
    if (path / "config.json").is_file():
        from vitscope.models.hf_load import load_hf

        return load_hf(str(path), name=name)
    if path.is_dir():
        raise ModelLoadError(f"'{name}' is a folder but not a model: it has no config.json (a save_pretrained "
                             "directory) and no vitscope.json (a vitscope checkpoint)")
    if path.is_file():
        raise ModelLoadError(f"'{name}' is a file; give the model's folder (the one holding config.json)")
    close = difflib.get_close_matches(name, list(reg), n=3, cutoff=0.4)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise UnknownModelError(f"unknown model '{name}'.{hint} See `vitscope models`, or use hf:<hub id or directory>.")


def describe_models() -> list[dict]:
    """Rows for ``vitscope models``: family, architecture, prefix tokens and offline availability."""
    from vitscope.models.hub_cache import is_cached

    rows = []
    for e in registry().values():
        offline = e.available() if e.available is not None else (e.builder is not None) or (
            e.hub_id is not None and is_cached(e.hub_id))
        rows.append({"name": e.name, "family": e.family, "blocks": e.blocks, "heads": e.heads, "width": e.width,
                     "patch": e.patch, "prefix": "+".join(e.prefix) or "-", "offline": offline,
                     "source": e.source or e.hub_id or "built-in"})
    return rows


