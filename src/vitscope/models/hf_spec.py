"""ModelSpec for Hugging Face models, from the config and the preprocessor JSON (read as transformers' image
processors read it, without running them)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from torch import nn

from vitscope.errors import VitscopeValueError
from vitscope.models.families import get_family
from vitscope.models.family import family_of
from vitscope.models.hf_layout import find_base, find_layers, find_module
from vitscope.models.spec import ModelSpec

#: where a Hugging Face model's preprocessing came from (``ModelSpec.preprocessing``)
CHECKPOINT_PROCESSOR = "checkpoint processor (preprocessor_config.json)"
FAMILY_DEFAULT = "family default (no preprocessor_config.json; input size from config.json)"

#: transformers' ConvNextImageProcessor default ``crop_pct`` (224 / 256)
_CONVNEXT_CROP_PCT = 224 / 256

_PIL_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


def _pair(x: Any) -> tuple[int, int]:
    if isinstance(x, dict):
        if "height" in x:
            return int(x["height"]), int(x["width"])
        s = x.get("shortest_edge")
        return int(s), int(s)
    if isinstance(x, (list, tuple)):
        return int(x[0]), int(x[1])
    return int(x), int(x)


def _processor_stem(preprocessor: dict[str, Any]) -> str:
    """``ViT`` of ``ViTImageProcessor``, ``ViTImageProcessorFast`` or ``ViTFeatureExtractor`` ("" when unnamed)."""
    name = str(preprocessor.get("image_processor_type") or preprocessor.get("feature_extractor_type") or "")
    return re.sub(r"(ImageProcessor(Fast|Pil)?|FeatureExtractor)$", "", name)


def _class_default(preprocessor: dict[str, Any], name: str, fallback: Any) -> Any:
    """The class attribute ``name`` of the checkpoint's processor class, which transformers uses for a setting the
    JSON leaves out or sets to null; ``fallback`` when the class is unknown or does not set it. Only the class
    attribute is read: nothing is instantiated."""
    stem = _processor_stem(preprocessor)
    if not stem:
        return fallback
    import transformers

    from vitscope.models.hf_pretrained import quiet_transformers

    for suffix in ("ImageProcessorPil", "ImageProcessor"):
        try:
            with quiet_transformers():
                cls = getattr(transformers, stem + suffix, None)
            if cls is not None:
                return getattr(cls, name, fallback)
        except (ImportError, RuntimeError, AttributeError):  # a class that needs a backend not installed
            continue
    return fallback


def _setting(preprocessor: dict[str, Any], name: str, fallback: Any) -> Any:
    """A processor setting as transformers reads it: the JSON's value, null included (transformers keeps None, so a
    null ``do_*`` flag turns its step off), else, when the JSON leaves it out, its class's default
    (:func:`_class_default`)."""
    return preprocessor[name] if name in preprocessor else _class_default(preprocessor, name, fallback)


def _refuse(key: str, problem: str) -> VitscopeValueError:
    return VitscopeValueError(f"preprocessor_config.json: {key} {problem}; fix it or remove the file")


#: a value transformers' processor cannot do without while the flag beside it is on (it refuses a null one)
_NEEDED = (("size", "do_resize"), ("resample", "do_resize"), ("crop_size", "do_center_crop"),
           ("rescale_factor", "do_rescale"), ("image_mean", "do_normalize"), ("image_std", "do_normalize"))


def _check_settings(preprocessor: Any) -> None:
    """Refuse what transformers' processor refuses or vitscope cannot follow: a JSON that is not an object, a null
    value its step needs, ``do_resize`` off (transformers then crops each image at its own size)."""
    if not isinstance(preprocessor, dict):
        raise VitscopeValueError(f"preprocessor_config.json holds a JSON {type(preprocessor).__name__}, not an object "
                                 "of processor settings; fix it or remove the file")
    for key, flag in _NEEDED:
        if key in preprocessor and preprocessor[key] is None and _setting(preprocessor, flag, True):
            raise _refuse(key, f"is null while {flag} is on, which transformers' processor refuses")
    if not _setting(preprocessor, "do_resize", True):
        raise _refuse("do_resize", f"is {json.dumps(preprocessor['do_resize'])}: transformers then centre-crops "
                      "each image at its own size, which vitscope cannot do (it resizes every image first)")


def _channels(preprocessor: dict[str, Any], key: str, fallback: tuple[float, ...]) -> tuple[float, ...]:
    """``image_mean`` or ``image_std`` per channel, as transformers reads it: the class default when left out, one
    number for all three channels, or three numbers."""
    value = _setting(preprocessor, key, fallback)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (float(value),) * 3
    if isinstance(value, (list, tuple)) and len(value) == 3 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return tuple(float(v) for v in value)
    raise _refuse(key, f"must be 3 numbers (or one for every channel), got {json.dumps(value)}")


def _square_by_default(preprocessor: dict[str, Any]) -> bool:
    """Whether the checkpoint's processor reads a bare number ``size`` (older checkpoints) as ``{height, width}``
    (ViT, DeiT, BEiT...) rather than the short side (CLIP, BiT, ConvNeXt): its class's ``default_to_square``,
    transformers' own default (True) when the class is unknown."""
    return bool(_class_default(preprocessor, "default_to_square", True))


def _size(preprocessor: dict[str, Any]) -> int | tuple[int, int] | None:
    """The processor's resize, as transformers reads its ``size``: a number, the short side (the aspect ratio
    kept); ``(height, width)``, the whole image resized to it (the aspect ratio not kept)."""
    size = preprocessor.get("size")
    if size is None:
        return None
    if isinstance(size, dict):
        if "shortest_edge" in size:
            return int(size["shortest_edge"])
        if "height" in size:
            return int(size["height"]), int(size["width"])
        return None
    if isinstance(size, (list, tuple)):
        return (int(size[0]), int(size[-1])) if len(size) == 2 else int(size[0])
    return (int(size), int(size)) if _square_by_default(preprocessor) else int(size)


def _off(preprocessor: dict[str, Any], name: str) -> str:
    """How the JSON turns a step off, for the note: ``do_normalize false`` or ``do_normalize null``."""
    return f"{name} {'null' if preprocessor.get(name, False) is None else 'false'}"


def _input_scale(preprocessor: dict[str, Any], mean: tuple[float, ...], std: tuple[float, ...]
                 ) -> tuple[tuple[float, ...], tuple[float, ...], str]:
    """The processor's ``image_mean`` and ``image_std`` (``mean`` and ``std`` when neither it nor its class says)
    with its ``do_rescale``, ``rescale_factor`` and ``do_normalize`` folded in, and a note saying which differ from
    transformers' usual ``(x / 255 - mean) / std`` ("" when none does).

    transformers gives the model ``(x * rescale_factor - mean) / std`` for uint8 ``x`` (``rescale_factor`` 1 without
    ``do_rescale``, mean 0 and std 1 without ``do_normalize``); vitscope computes ``(x / 255 - mean') / std'``, the
    same input when ``mean' = mean / (255 rescale_factor)`` and ``std' = std / (255 rescale_factor)``. A setting the
    JSON leaves out is its class's default, on (and 1 / 255) when the class is unknown, as every transformers image
    processor sets them; a flag set to null is off, as transformers reads it."""
    notes = []
    normalise, rescale = _setting(preprocessor, "do_normalize", True), _setting(preprocessor, "do_rescale", True)
    factor = float(_setting(preprocessor, "rescale_factor", 1 / 255)) if rescale else 1.0
    if normalise:
        mean, std = _channels(preprocessor, "image_mean", mean), _channels(preprocessor, "image_std", std)
    else:
        mean, std = (0.0,) * 3, (1.0,) * 3
        notes.append(f"not normalised ({_off(preprocessor, 'do_normalize')})")
    if not rescale:
        notes.append(f"pixels 0-255 ({_off(preprocessor, 'do_rescale')})")
    elif not math.isclose(factor, 1 / 255, rel_tol=1e-6):
        notes.append(f"pixels times {factor:g} (rescale_factor)")
    scale = 255 * factor
    if not math.isclose(scale, 1.0, rel_tol=1e-6):  # a factor of 1 / 255 written to fewer digits changes nothing
        mean, std = tuple(m / scale for m in mean), tuple(v / scale for v in std)
    return mean, std, "".join(f"; {n}" for n in notes)


def read_preprocessing(preprocessor: dict[str, Any] | None, family: str, image_size: tuple[int, int]) -> dict[str, Any]:
    """Mean, std, resize, crop size and interpolation from a ``preprocessor_config.json`` dict, and where they come
    from (``preprocessing``: :data:`CHECKPOINT_PROCESSOR` or :data:`FAMILY_DEFAULT`).

    The resize follows transformers' processors: a ``size`` of height and width (or a bare number for processors
    that read it so, ViT, DeiT, BEiT...) resizes the whole image to it, its aspect ratio not kept
    (``resize_size=(h, w)``); a ``shortest_edge`` resizes the short side (ConvNeXt's processor, which HF ResNets
    use too, to ``shortest_edge / crop_pct`` before a crop of ``shortest_edge``). A centre crop follows when the
    processor does one (``do_center_crop``, ``crop_size``). Without it a fixed-size resize is the input; a short-side
    resize would give each image its own aspect ratio, and since vitscope feeds every image at one input size it
    centre-crops the square of the short side, which ``preprocessing`` says. A setting the JSON leaves out is its
    processor class's default, as transformers reads it: ViT, SigLIP and BEiT processors do not crop unless told
    to, CLIP, DeiT and BiT processors do; a flag set to null is off, as transformers keeps it. ``do_rescale``,
    ``rescale_factor`` and ``do_normalize`` are folded into the mean and std (:func:`_input_scale`), and
    ``preprocessing`` says so.

    Raises:
        VitscopeValueError: settings transformers' processor refuses (a 2-number ``image_mean``, a null
            ``crop_size`` while ``do_center_crop`` is on...), a JSON that is not an object, or ``do_resize`` off.
    """
    out = dict(get_family(family).preprocessing)  # the family's defaults, when the checkpoint says nothing
    out["image_size"] = image_size
    out["resize_size"] = max(image_size)
    out["resize_rule"] = "transformers"  # the long side truncated, as transformers' processors do
    if preprocessor is None or preprocessor == {}:
        out["preprocessing"] = FAMILY_DEFAULT
        return out
    _check_settings(preprocessor)
    out["preprocessing"] = CHECKPOINT_PROCESSOR
    out["mean"], out["std"], note = _input_scale(preprocessor, tuple(out["mean"]), tuple(out["std"]))
    out["preprocessing"] += note
    if "resample" in preprocessor:
        out["interpolation"] = _PIL_RESAMPLE.get(int(preprocessor["resample"]), "bicubic")
    if "max_num_patches" in preprocessor:  # SigLIP 2 NaFlex: each image at its aspect ratio, this many patches
        out["max_tokens"] = int(preprocessor["max_num_patches"])
    crop = _setting(preprocessor, "crop_size", None) if _setting(preprocessor, "do_center_crop", None) else None
    size = _size(preprocessor)
    if isinstance(size, int) and ("crop_pct" in preprocessor or _processor_stem(preprocessor) == "ConvNext"):
        # ConvNeXt's processor (HF ResNet and ConvNeXt checkpoints): below 384 px, the short side to
        # size / crop_pct, then a centre crop of size; from 384 px, the whole image to size x size
        out["image_size"] = (size, size)
        pct = preprocessor.get("crop_pct") or _CONVNEXT_CROP_PCT
        size = int(size / pct) if size < 384 else (size, size)
    elif isinstance(size, int) and crop is None and "max_tokens" not in out:
        out["image_size"] = (size, size)  # one input size for every image: the short side's square
        out["preprocessing"] += f"; centre crop to {size}x{size} px added (no crop in the processor)"
    if crop is not None:
        out["image_size"] = _pair(crop)
    if isinstance(size, tuple):
        out["resize_size"] = size
        if crop is None:
            out["image_size"] = size
    elif size is not None:
        out["resize_size"] = size
    return out


def load_preprocessor_json(source: str, **hub_kwargs: Any) -> dict[str, Any] | None:
    """``preprocessor_config.json`` of a local directory or a hub id (cache first), or None."""
    local = Path(source) / "preprocessor_config.json"
    if local.is_file():
        try:
            return json.loads(local.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise VitscopeValueError(f"{local} is not valid JSON ({err}); fix or remove it") from None
    if Path(source).is_dir():
        return None
    from transformers.utils import cached_file

    try:
        path = cached_file(source, "preprocessor_config.json", _raise_exceptions_for_missing_entries=False,
                           **hub_kwargs)
    except OSError:
        return None
    return json.loads(Path(path).read_text()) if path else None


def _mlp_width(model: nn.Module, family: str) -> int:
    """The width of ``mlp.post``: the input of the first block's MLP output projection, as built (a gated MLP's is
    not ``hidden_size * mlp_ratio``: DINOv2's SwiGLU rounds two thirds of it up to a multiple of 8)."""
    layout = get_family(family).layout
    first = find_layers(find_base(model), layout)[0]
    out = find_module(find_module(first, layout.mlp, "MLP"), layout.mlp_out, "MLP output projection")
    return int(out.in_features)


def transformer_spec(name: str, model: nn.Module, config: Any, preprocessing: dict[str, Any]) -> ModelSpec:
    """ModelSpec of an HF vision transformer; prefix tokens in canonical order."""
    family = family_of(config)
    patch = int(config.patch_size)
    image_size = tuple(preprocessing["image_size"])
    prefix = tuple(get_family(family).prefix(config))
    mlp_dim = _mlp_width(model, family)
    return ModelSpec(
        name=name, family=family, kind="transformer",
        num_blocks=int(config.num_hidden_layers), num_heads=int(config.num_attention_heads),
        embed_dim=int(config.hidden_size), mlp_dim=int(mlp_dim), patch_size=patch,
        grid=(image_size[0] // patch, image_size[1] // patch), num_prefix_tokens=len(prefix),
        prefix_kinds=prefix, image_size=image_size, mean=preprocessing["mean"], std=preprocessing["std"],
        has_head=hasattr(model, "classifier") or hasattr(model, "cls_classifier"),
        resize_size=preprocessing["resize_size"], interpolation=preprocessing["interpolation"],
        preprocessing=preprocessing.get("preprocessing", FAMILY_DEFAULT), max_tokens=preprocessing.get("max_tokens"),
        resize_rule=preprocessing.get("resize_rule", "transformers"),
    )
