"""Where zoo weights live and how they are loaded: fp16 safetensors checked against a sha256 manifest.

The shipped weights are in the package (``vitscope/zoo/weights``); ``VITSCOPE_ZOO_DIR`` points loading
and ``vitscope zoo build`` at another directory. ``manifest.json`` holds, per file, its sha256, and per
model its build record (the entry it was built from, recipe, data seed, parameter count, held-out score and
baselines). Loading checks the file's sha256 and that the entry's architecture is the one it was built with.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from vitscope.atomic import atomic_path, write_text_atomic
from vitscope.errors import VitscopeValueError
from vitscope.models.backbone import Backbone
from vitscope.models.errors import ModelLoadError
from vitscope.strict_json import dumps
from vitscope.zoo.catalog import ZooEntry, get_entry

__all__ = ["MANIFEST", "build_model", "is_built", "load_zoo_model", "model_config", "read_manifest", "roundtrip_fp16",
           "save_weights", "sha256", "split_name", "wrap_zoo_model", "write_manifest", "zoo_dir"]

MANIFEST = "manifest.json"
_PACKAGED = Path(__file__).resolve().parent / "weights"


def zoo_dir(directory: str | os.PathLike | None = None) -> Path:
    """The zoo directory: ``directory``, else ``$VITSCOPE_ZOO_DIR``, else the packaged weights."""
    if directory is not None:
        return Path(directory)
    env = os.environ.get("VITSCOPE_ZOO_DIR")
    return Path(env) if env else _PACKAGED


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of ``directory`` (an empty one when none was written yet)."""
    path = directory / MANIFEST
    if not path.is_file():
        return {"format": 1, "files": {}, "models": {}}
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelLoadError(f"{path} is not a readable zoo manifest ({type(err).__name__}: {err}); rebuild the "
                             "zoo or reinstall vitscope") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ModelLoadError(f"{path} is not a zoo manifest (no 'files' table); rebuild the zoo or reinstall vitscope")
    return manifest


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest atomically (sorted, so rebuilding one model changes only its lines)."""
    write_text_atomic(directory / MANIFEST, dumps(manifest, indent=1, sort_keys=True) + "\n")


def split_name(name: str) -> tuple[str, int | None]:
    """``"tiny-vit-metric@step250"`` -> ``("tiny-vit-metric", 250)``; plain names -> ``(name, None)``."""
    base, sep, step = name.partition("@step")
    if not sep:
        return name, None
    if not step.isdigit():
        raise ModelLoadError(f"bad training-checkpoint name '{name}': expected NAME@step<integer>")
    return base, int(step)


def model_config(arch: str, model: Mapping[str, Any]) -> Any:
    """The ``TinyViTConfig`` or ``TinyResNetConfig`` of architecture ``arch`` with arguments ``model``."""
    from vitscope.models.tiny import TinyResNetConfig, TinyViTConfig

    if arch == "tiny-vit":
        return TinyViTConfig(**model)
    if arch == "tiny-resnet":
        cfg = dict(model)
        if "widths" in cfg:  # a list when read from JSON
            cfg["widths"] = tuple(cfg["widths"])
        return TinyResNetConfig(**cfg)
    raise VitscopeValueError(f"unknown zoo architecture '{arch}'")


def build_model(entry: ZooEntry) -> nn.Module:
    """The entry's architecture with its seeded initial weights (the randomly initialised twin)."""
    from vitscope.models.tiny import TinyResNet, TinyViT

    config = model_config(entry.arch, entry.model)
    return TinyViT(config) if entry.arch == "tiny-vit" else TinyResNet(config)


def wrap_zoo_model(model: nn.Module, name: str, entry: ZooEntry | None = None) -> Backbone:
    """The zoo ``model`` as a Backbone named ``name``; a metric entry's head is its embedding projection
    (``ModelSpec.head_output``). ``entry``: the catalogue entry (default: looked up by name)."""
    from vitscope.models.tiny import TinyViT
    from vitscope.models.wrap import wrap, wrap_tiny_vit

    backbone = wrap_tiny_vit(model, name) if isinstance(model, TinyViT) else wrap(model, "tiny-resnet", name=name)
    try:
        metric = (entry or get_entry(split_name(name)[0])).recipe == "metric"
    except KeyError:  # a twin named outside the catalogue
        metric = False
    if metric:  # its head projects the embedding the metric loss trained: no classes
        backbone.spec = dataclasses.replace(backbone.spec, head_output="embedding")
    return backbone


def save_weights(model: nn.Module, path: Path, name: str) -> str:
    """Save ``model``'s weights as fp16 safetensors (integer buffers unchanged); return the file's sha256."""
    state = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in model.state_dict().items()}
    with atomic_path(path) as tmp:
        save_file(state, str(tmp), metadata={"name": name, "format": "vitscope-zoo-1"})
    return sha256(path)


def is_built(name: str, directory: str | os.PathLike | None = None) -> bool:
    """Whether ``name``'s weights are listed in the zoo manifest and present (``@step0`` always is)."""
    if split_name(name)[1] == 0:
        return True
    d = zoo_dir(directory)
    return f"{name}.safetensors" in read_manifest(d)["files"] and (d / f"{name}.safetensors").is_file()


def load_zoo_model(name: str, directory: str | os.PathLike | None = None, entry: ZooEntry | None = None) -> Backbone:
    """Load zoo model ``name`` (or a training checkpoint ``NAME@step<k>``) after checking its sha256.

    ``NAME@step0`` is the untrained model (the seeded initial weights; no file needed).

    Args:
        name: zoo name, or ``NAME@step<k>``.
        directory: zoo directory (default: :func:`zoo_dir`).
        entry: the catalogue entry (default: looked up by name; pass your own for models you built).

    Raises:
        ModelLoadError: not built in this directory, the file does not match the manifest, or ``entry``'s
            architecture is not the one the file was built with (the manifest's record of it, then the file's
            tensor names and shapes).
    """
    base, step = split_name(name)
    try:
        entry = entry or get_entry(base)
    except KeyError as err:
        raise ModelLoadError(str(err.args[0])) from None
    if step == 0:  # the seeded initialisation: reproducible, so never shipped
        return wrap_zoo_model(build_model(entry).eval(), name, entry)
    d = zoo_dir(directory)
    fname = f"{name}.safetensors"
    manifest = read_manifest(d)
    expected = manifest["files"].get(fname)
    path = d / fname
    if expected is None or not path.is_file():
        raise ModelLoadError(f"zoo model '{name}' is not built in {d}; run `vitscope zoo build {base}`")
    if sha256(path) != expected:
        raise ModelLoadError(f"{path} does not match its checksum in {d / MANIFEST} (corrupted or replaced); "
                             f"restore it or rebuild with `vitscope zoo build {base}`")
    record = manifest.get("models", {}).get(base, {}).get("entry")
    if isinstance(record, dict):  # files shipped without a build record are checked by their tensors alone
        _check_architecture(entry, record, path)
    model = build_model(entry)
    _load_weights(model, load_file(str(path)), path)
    model.eval()
    return wrap_zoo_model(model, name, entry)


def _check_architecture(entry: ZooEntry, record: Mapping[str, Any], path: Path) -> None:
    """Refuse ``entry`` when its architecture is not the recorded one the file was built with.

    The number of heads, for one, changes no tensor's shape: such a file would load and compute other numbers.
    """
    try:
        built = asdict(model_config(record["arch"], record["model"]))
    except (KeyError, TypeError, VitscopeValueError) as err:
        raise ModelLoadError(f"the manifest's build record of {path.name} names an architecture this vitscope cannot "
                             f"read ({type(err).__name__}: {err}); rebuild it with `vitscope zoo build`") from None
    if record["arch"] != entry.arch:
        raise ModelLoadError(f"{path} was built as a {record['arch']}, not the {entry.arch} of the entry given; "
                             "load it with the entry it was built from (its record in the manifest)")
    given = asdict(model_config(entry.arch, entry.model))
    # the initial weights' seed is replaced by the file's weights: it changes no number of the loaded model
    differ = [f"{k} {built[k]!r} (built) != {given[k]!r} (entry)" for k in built
              if k != "seed" and built[k] != given[k]]
    if differ:
        raise ModelLoadError(f"{path} was built with another architecture than the entry given: {'; '.join(differ)}; "
                             "load it with the entry it was built from (its record in the manifest) or rebuild it")


def _load_weights(model: nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    """Load ``state`` into ``model`` in the model's dtypes, or a ModelLoadError naming the tensors that do not fit."""
    reference = model.state_dict()
    problems = [f"{what} {_few(names)}" for what, names in (("missing", reference.keys() - state.keys()),
                                                             ("unexpected", state.keys() - reference.keys())) if names]
    problems += [f"{k} {tuple(state[k].shape)} (file) != {tuple(reference[k].shape)} (model)"
                 for k in sorted(state.keys() & reference.keys()) if state[k].shape != reference[k].shape][:3]
    if problems:
        raise ModelLoadError(f"{path} does not fit the entry's architecture ({'; '.join(problems)}); load it with the "
                             "entry it was built from or rebuild it")
    model.load_state_dict({k: v.to(reference[k].dtype) for k, v in state.items()})


def _few(names: set[str], most: int = 3) -> str:
    listed = sorted(names)
    return ", ".join(listed[:most]) + (f" and {len(listed) - most} more" if len(listed) > most else "")


def roundtrip_fp16(model: nn.Module) -> None:
    """Round ``model``'s floating-point weights to fp16 in place (what loading the shipped file gives)."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if t.is_floating_point():
                t.copy_(t.half().float())
