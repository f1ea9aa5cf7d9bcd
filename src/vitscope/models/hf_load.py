"""Load Hugging Face checkpoints (hub ids or local ``save_pretrained`` directories) as Backbones."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import nn

from vitscope.errors import VitscopeTypeError
from vitscope.models.backbone import Backbone
from vitscope.models.cnn import CNNBackbone, cnn_spec, hf_cnn_layout
from vitscope.models.errors import TRUST_PICKLE_ENV, ModelLoadError
from vitscope.models.families import get_family
from vitscope.models.family import family_of
from vitscope.models.hf import HFViTBackbone
from vitscope.models.hf_spec import load_preprocessor_json, read_preprocessing, transformer_spec
from vitscope.models.hub_cache import is_cached
from vitscope.models.preprocess import aspect_size


def _offline_message(source: str) -> str:
    return (f"cannot load '{source}': it is not in the local Hugging Face cache and the hub cannot be reached "
            "(offline). Download it once on a connected machine, or pass a local save_pretrained directory.")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub endpoint accepts a TCP connection (one quick probe instead of minutes of retries)."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def _load_config(source: str, **hub: Any) -> Any:
    from transformers import AutoConfig

    try:  # never a checkpoint's own code (auto_map): transformers would ask on the terminal, and a "y" ran it
        return AutoConfig.from_pretrained(source, trust_remote_code=False, **hub)
    except OSError as err:
        if Path(source).exists():
            raise ModelLoadError(f"'{source}' has no readable config.json: not a save_pretrained directory") from None
        text = str(err).lower()
        if any(w in text for w in ("offline", "connect", "resolve", "network", "cache", "internet")):
            raise ModelLoadError(_offline_message(source)) from None
        raise ModelLoadError(f"cannot load '{source}': {str(err).splitlines()[0]}") from None
    except ValueError as err:
        if "custom code" in str(err):
            raise ModelLoadError(f"'{source}' asks to run code of its own (auto_map in config.json), which vitscope "
                                 "never does: load a checkpoint of a family it knows (vitscope models)") from None
        raise ModelLoadError(f"cannot load '{source}': {str(err).splitlines()[0]}") from None


def _instantiate(source: str, config: Any, **hub: Any) -> nn.Module:
    """Load ``source`` with the model class its family calls for (vision tower only for CLIP/SigLIP)."""
    try:
        family = get_family(family_of(getattr(config, "vision_config", config)))
    except KeyError as err:
        raise ModelLoadError(str(err.args[0])) from None
    return family.load(source, config, **hub)


def wrap_hf(model: nn.Module, name: str, preprocessor: dict[str, Any] | None = None,
            overrides: dict[str, Any] | None = None) -> Backbone:
    """Adapt an instantiated transformers model (vision transformer or ResNet/BiT/ConvNeXt); the family's
    ``prepare`` sets what its forward needs to see the whole image (ViT-MAE: ``config.mask_ratio`` 0)."""
    config = getattr(model, "config", None)
    if config is None:
        raise VitscopeTypeError(f"{type(model).__name__} has no transformers config")
    vision = getattr(config, "vision_config", config)
    family = family_of(vision)
    model.eval()
    try:
        kind = get_family(family).kind
    except KeyError as err:
        raise ModelLoadError(str(err.args[0])) from None
    if kind == "cnn":
        size = int(getattr(vision, "image_size", 224) or 224)
        prep = read_preprocessing(preprocessor, family, (size, size)) | dict(overrides or {})
        layout = hf_cnn_layout(model)
        image_size = tuple(prep.pop("image_size"))
        spec = cnn_spec(name, family, layout.call, layout, image_size, layout.classifier is not None, **prep)
        return CNNBackbone(model, spec, layout)
    descriptor = get_family(family)
    descriptor.prepare(model)
    prep = read_preprocessing(preprocessor, family, tuple(descriptor.input_size(vision)))
    prep.update(overrides or {})
    budget = prep.pop("max_tokens", None) or descriptor.token_budget(vision)
    if budget:  # each image keeps its aspect ratio: a square one fills the budget
        prep["max_tokens"] = int(budget)
        prep["image_size"] = aspect_size((1, 1), int(vision.patch_size), int(budget))
        prep["resize_size"] = None
    return HFViTBackbone(model, transformer_spec(name, model, vision, prep))


#: weights files that are pickles (they can run code when unpickled)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def refuse_pickle_weights(directory: Path) -> None:
    """Raise unless ``directory`` holds safetensors weights, or pickled weights and the user trusts them.

    Raises:
        ModelLoadError: only pickle weights and no ``--trust-pickle`` / ``VITSCOPE_TRUST_PICKLE=1``.
    """
    files = [p for p in directory.iterdir() if p.is_file()]
    if any(p.suffix == ".safetensors" for p in files):
        return
    pickles = sorted(p.name for p in files if p.suffix in PICKLE_SUFFIXES)
    if pickles and os.environ.get(TRUST_PICKLE_ENV, "") not in ("1", "true", "yes"):
        raise ModelLoadError(f"'{directory}' holds its weights as pickle ({', '.join(pickles[:3])}), which can run "
                             "code when loaded, and no .safetensors; convert them to safetensors, or, if you trust "
                             "their source, pass --trust-pickle (library: VITSCOPE_TRUST_PICKLE=1)")


def load_hf(source: str, name: str | None = None, overrides: dict[str, Any] | None = None) -> Backbone:
    """Load ``source`` (hub id or local directory) and wrap it.

    Raises:
        ModelLoadError: offline and not cached, not a model directory, or an unsupported type.
    """
    hub: dict[str, Any] = {}
    if not Path(source).exists() and not hub_reachable():
        if not is_cached(source):
            raise ModelLoadError(_offline_message(source))
        hub["local_files_only"] = True  # cached: load it without minutes of network retries
    config = _load_config(source, **hub)
    if Path(source).is_dir():
        refuse_pickle_weights(Path(source))
    try:
        model = _instantiate(source, config, **hub)
    except OSError as err:
        if os.environ.get("HF_HUB_OFFLINE") or "offline" in str(err).lower() or "connect" in str(err).lower():
            raise ModelLoadError(_offline_message(source)) from None
        raise ModelLoadError(f"cannot load weights of '{source}': {str(err).splitlines()[0]}") from None
    return wrap_hf(model, name or f"hf:{source}", load_preprocessor_json(source, **hub), overrides)
