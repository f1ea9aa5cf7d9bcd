"""vitscope checkpoints of built-in models: ``vitscope.json`` (architecture) + ``model.safetensors``."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from vitscope.atomic import temporary_path
from vitscope.errors import VitscopeTypeError, VitscopeValueError
from vitscope.models.backbone import Backbone
from vitscope.models.errors import ModelLoadError
from vitscope.strict_json import write_json_atomic

FORMAT_VERSION = 1


def save_checkpoint(backbone: Backbone, directory: str | Path, **metadata: object) -> Path:
    """Save a tiny-model backbone's config and weights (safetensors, never pickle)."""
    from vitscope.models.tiny import TinyResNet, TinyViT

    model = backbone.model
    if not isinstance(model, (TinyViT, TinyResNet)):
        raise VitscopeTypeError("vitscope checkpoints hold built-in tiny models; save HF models with save_pretrained")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    arch = "tiny-vit" if isinstance(model, TinyViT) else "tiny-resnet"
    meta = {"format": FORMAT_VERSION, "architecture": arch, "name": backbone.spec.name,
            "config": model.config.to_dict(), "metadata": metadata}
    if backbone.spec.head_output != "logits":  # a metric net's head is its embedding: it stays one when reloaded
        meta["head_output"] = backbone.spec.head_output
    # weights first, each file through a temporary name: a folder with vitscope.json always has whole weights
    tmp = temporary_path(out / "model.safetensors")
    try:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp))
        os.replace(tmp, out / "model.safetensors")
    finally:
        tmp.unlink(missing_ok=True)
    write_json_atomic(out / "vitscope.json", meta)
    return out


def load_checkpoint(directory: str | Path) -> Backbone:
    """Load a checkpoint written by :func:`save_checkpoint`."""
    import torch

    from vitscope.models.tiny import TinyResNet, TinyResNetConfig, TinyViT, TinyViTConfig
    from vitscope.models.wrap import wrap, wrap_tiny_vit

    d = Path(directory)
    try:
        meta = json.loads((d / "vitscope.json").read_text())
        cfg, arch = meta["config"], meta["architecture"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
        raise VitscopeValueError(f"{d / 'vitscope.json'} is not a vitscope checkpoint description ({err!r}); "
                                 "write checkpoints with vitscope.models.checkpoint.save_checkpoint") from None
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{d / 'vitscope.json'}: its config is not a mapping of settings")

    def build() -> torch.nn.Module:
        if arch == "tiny-vit":
            return TinyViT(TinyViTConfig(**cfg))
        return TinyResNet(TinyResNetConfig(**{**cfg, "widths": tuple(cfg["widths"])}))

    weights = d / "model.safetensors"
    try:
        with safe_open(str(weights), framework="pt") as f:
            stored = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (the header alone)
        _fits_header(cfg, arch, stored, weights)  # before building: a deep description costs its modules' making
        try:
            with torch.device("meta"):  # shapes only: a description asking for a huge model allocates nothing
                shapes = {k: tuple(v.shape) for k, v in build().state_dict().items()}
        except (TypeError, KeyError, ValueError) as err:
            raise ModelLoadError(f"{d / 'vitscope.json'}: its config does not describe a {arch} ({err})") from None
        differ = sorted(k for k in shapes.keys() | stored.keys() if shapes.get(k) != stored.get(k))
        if differ:
            k = differ[0]
            raise ModelLoadError(f"{weights} does not fit the architecture in vitscope.json: {k} is "
                                 f"{list(stored[k]) if k in stored else 'missing'} in the file, "
                                 f"{list(shapes[k]) if k in shapes else 'unknown'} in the model "
                                 f"({len(differ)} tensor(s) differ)")
        state = load_file(str(weights))
    except SafetensorError as err:
        raise ModelLoadError(f"{weights} is damaged ({str(err).splitlines()[0]}); save the checkpoint again") from None
    model = build()
    try:
        model.load_state_dict(state)
    except RuntimeError as err:  # missing, unexpected or mis-shaped tensors
        detail = " ".join(str(err).split())
        raise ModelLoadError(f"{weights} does not fit the architecture in vitscope.json: {detail[:300]}") from None
    name = meta.get("name") or d.name
    backbone = wrap_tiny_vit(model, name) if meta["architecture"] == "tiny-vit" else wrap(model, "tiny-resnet",
                                                                                          name=name)
    if meta.get("head_output", "logits") != "logits":
        backbone.spec = dataclasses.replace(backbone.spec, head_output=str(meta["head_output"]))
    return backbone


#: the most stages a tiny-resnet description may ask for before its model is made (vitscope's have 4)
_MAX_STAGES = 64


def _fits_header(cfg: dict, arch: str, stored: dict[str, tuple[int, ...]], weights: Path) -> None:
    """Refuse, from the weights' header and one block made on the meta device, a tiny-vit description whose blocks
    are not the weights' (every block's every tensor, by name and shape), and a tiny-resnet one of more than
    :data:`_MAX_STAGES` stages or another number than the weights hold: making a model a description asks for costs
    its modules, and a header can name millions of empty tensors.

    Raises:
        ModelLoadError: they differ.
    """
    import torch

    from vitscope.models.tiny import TinyViT, TinyViTConfig

    if arch != "tiny-vit":
        widths = cfg.get("widths")
        held = len({k.split(".")[1] for k in stored if k.startswith("stages.")})
        if isinstance(widths, (list, tuple)) and (len(widths) != held or held > _MAX_STAGES):
            raise ModelLoadError(f"{weights} does not fit the architecture in vitscope.json: it holds {held} stages, "
                                 f"the description {len(widths)} (at most {_MAX_STAGES})")
        return
    depth = cfg.get("depth")
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
        return  # the model's own checks name it
    held = len({k.split(".")[1] for k in stored if k.startswith("blocks.")})
    if held != depth:
        raise ModelLoadError(f"{weights} does not fit the architecture in vitscope.json: it holds {held} blocks, the "
                             f"description {depth}")
    try:
        with torch.device("meta"):
            one = {k: tuple(v.shape) for k, v in TinyViT(TinyViTConfig(**{**cfg, "depth": 1})).state_dict().items()}
    except (TypeError, KeyError, ValueError):
        return  # the model's own checks name it
    block = {k.split(".", 2)[2]: v for k, v in one.items() if k.startswith("blocks.0.")}
    rest = {k: v for k, v in one.items() if not k.startswith("blocks.")}
    for key, shape in stored.items():
        parts = key.split(".", 2)
        wanted = block.get(parts[2]) if key.startswith("blocks.") and len(parts) == 3 else rest.get(key)
        if wanted != shape:
            raise ModelLoadError(f"{weights} does not fit the architecture in vitscope.json: {key} is {list(shape)} "
                                 f"in the file, {list(wanted) if wanted is not None else 'unknown'} in the model")
    if len(stored) != len(rest) + depth * len(block):
        raise ModelLoadError(f"{weights} does not fit the architecture in vitscope.json: it holds {len(stored)} "
                             f"tensors, the model {len(rest) + depth * len(block)}")

