"""The one description of a model that every analysis reads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vitscope.errors import VitscopeValueError

#: the ways a resize and a centre crop round (:attr:`ModelSpec.resize_rule`)
RESIZE_RULES = ("vitscope", "transformers", "torchvision")
#: PIL's resampling filters, by the names :attr:`ModelSpec.interpolation` takes
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming")
#: what a head gives (:attr:`ModelSpec.head_output`)
HEAD_OUTPUTS = ("logits", "embedding")


def starts_with_cls(prefix_kinds: Sequence[str]) -> bool:
    """Whether prefix tokens of these kinds (``ModelSpec.prefix_kinds``, or a result's record of them) begin with a
    CLS token: not for a model that pools its tokens (SigLIP, I-JEPA, AIMv2) or has registers only."""
    return tuple(prefix_kinds)[:1] == ("cls",)


@dataclass(frozen=True)
class ModelSpec:
    """Static facts about a backbone, shared by every analysis.

    Attributes:
        name: registry name or path the model was loaded from.
        family: adapter family (``"vit"``, ``"deit"``, ``"dinov2"``, ``"clip"``, ``"siglip"``,
            ``"vit_mae"``, ``"beit"``, ``"timm"``, ``"tiny-vit"``, ``"resnet"``, ...).
        kind: ``"transformer"`` or ``"cnn"``.
        num_blocks: transformer blocks (CNN: stages).
        num_heads: attention heads per block (0 for CNNs).
        embed_dim: residual width (CNN: channels of the last feature map).
        mlp_dim: hidden width of the MLP (0 for CNNs).
        patch_size: pixels per patch side (CNN: total stride of the last feature map).
        grid: ``(h, w)`` spatial tokens (or final feature map) at ``image_size``.
        num_prefix_tokens: CLS + distillation + register tokens before the spatial tokens.
        prefix_kinds: one entry per prefix token, canonical order, e.g. ``("cls", "reg", "reg")``.
        image_size: ``(H, W)`` model input in pixels.
        mean: per-channel normalisation mean (RGB, pixels in [0, 1]): the model's input is ``(x / 255 - mean) / std``
            for uint8 pixels ``x``. A processor that does not normalise has mean 0 and std 1; one that rescales by
            another factor than 1 / 255 has that factor folded into mean and std.
        std: per-channel normalisation std.
        has_head: whether ``Backbone.head`` exists.
        head_output: what the head gives: ``"logits"`` (a classifier's classes) or ``"embedding"`` (a metric-learning
            projection, compared by cosine: no classes to score). Left out of :meth:`to_dict` when ``"logits"``.
        resize_size: a number: the short side the image is resized to (its aspect ratio kept) before the centre
            crop (None: the crop's long side). ``(h, w)``: the whole image is resized to ``h x w`` (its aspect
            ratio not kept), then centre-cropped to ``image_size`` (nothing cropped when they are equal), as Hugging
            Face processors with a fixed ``size`` of height and width do.
        interpolation: PIL resampling used for the resize, one of :data:`INTERPOLATIONS` (``"bicubic"``,
            ``"bilinear"``, ...).
        resize_rule: how the resize and the crop round, after the library the model comes from: ``"vitscope"``
            (the long side ``round(long * short / image short)``: vitscope's own models), ``"transformers"`` (the
            long side truncated, ``int(...)``, the crop's offsets ``(size - crop) // 2``: Hugging Face image
            processors) or ``"torchvision"`` (the long side truncated, the offsets ``round((size - crop) / 2)``:
            timm's evaluation transform, and the aliases of papers whose code used torchvision's ``Resize`` and
            ``CenterCrop``). Left out of :meth:`to_dict` when ``"vitscope"``.
        preprocessing: where mean, std, resize and crop come from (the checkpoint's processor, the family's
            defaults, a registered alias, the user's image size...), shown in a run's output and report.
        max_tokens: None: resize and centre crop to ``image_size`` (one grid for every image). A number: each
            image keeps its aspect ratio and is resized to the largest multiple of the patch size on each side
            with at most this many patches (SigLIP 2 NaFlex's rule; ``--keep-aspect``), so images of one run have
            different grids; ``image_size`` and ``grid`` are then those of a square image.
    """

    name: str
    family: str
    kind: str
    num_blocks: int
    num_heads: int
    embed_dim: int
    mlp_dim: int
    patch_size: int
    grid: tuple[int, int]
    num_prefix_tokens: int
    prefix_kinds: tuple[str, ...]
    image_size: tuple[int, int]
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    has_head: bool = False
    resize_size: int | tuple[int, int] | None = None
    interpolation: str = "bicubic"
    preprocessing: str = "ImageNet statistics (ModelSpec defaults)"
    max_tokens: int | None = None
    resize_rule: str = "vitscope"
    head_output: str = "logits"

    def __post_init__(self) -> None:
        if len(self.prefix_kinds) != self.num_prefix_tokens:
            raise VitscopeValueError("prefix_kinds must have one entry per prefix token")
        if self.head_output not in HEAD_OUTPUTS:
            raise VitscopeValueError(f"head_output must be one of {', '.join(HEAD_OUTPUTS)}, got {self.head_output!r}")
        if self.resize_rule not in RESIZE_RULES:
            raise VitscopeValueError(f"resize_rule must be one of {', '.join(RESIZE_RULES)}, got {self.resize_rule!r}")
        if self.interpolation not in INTERPOLATIONS:  # refused when the model loads, not at its first image
            raise VitscopeValueError(f"unknown interpolation {self.interpolation!r} for {self.name}; use one of "
                                     f"{', '.join(INTERPOLATIONS)}")

    @property
    def is_transformer(self) -> bool:
        return self.kind == "transformer"

    @property
    def classifies(self) -> bool:
        """Whether the head gives class logits (accuracies, a class's logit, KL between class distributions)."""
        return self.has_head and self.head_output == "logits"

    @property
    def has_cls_token(self) -> bool:
        """Whether the first token is a CLS token (:func:`starts_with_cls`)."""
        return starts_with_cls(self.prefix_kinds)

    @property
    def num_spatial_tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def num_tokens(self) -> int:
        return self.num_prefix_tokens + self.num_spatial_tokens

    def grid_for(self, height: int, width: int) -> tuple[int, int]:
        """Token grid for an input of ``height x width`` pixels (inputs larger than the training size)."""
        return height // self.patch_size, width // self.patch_size

    def to_dict(self) -> dict:
        """JSON-friendly description (for results.json and ``vitscope models``)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        if self.max_tokens is None:  # one grid per run: nothing to say
            del out["max_tokens"]
        if self.resize_rule == "vitscope":  # vitscope's own rule: results and digests as they were before it was said
            del out["resize_rule"]
        if self.head_output == "logits":  # likewise for a classifier's head (and a model without one)
            del out["head_output"]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


def input_text(spec: Mapping[str, Any]) -> str:
    """The input size, resize, token grid (CNN: feature map) and where the preprocessing came from, in one line,
    from :meth:`ModelSpec.to_dict` (or a model entry of results.json): ``518x518 px (short side resized to 518 px,
    centre crop), token grid 37x37 (1,370 tokens); preprocessing: family default (...)``."""
    (h, w), (gh, gw) = spec["image_size"], spec["grid"]
    resize = "centre crop"
    if isinstance(spec.get("resize_size"), (list, tuple)):  # the whole image, its aspect ratio not kept
        rh, rw = spec["resize_size"]
        resize = f"whole image resized to {rh}x{rw} px" + (", centre crop" if (rh, rw) != (h, w) else "")
    elif spec.get("resize_size"):
        resize = f"short side resized to {spec['resize_size']} px, centre crop"
    if spec.get("max_tokens"):
        return (f"aspect ratio kept, at most {spec['max_tokens']:,} patches of {spec['patch_size']} px per image "
                f"(a square image: {h}x{w} px, token grid {gh}x{gw}); preprocessing: "
                f"{spec.get('preprocessing', 'not recorded')}")
    if spec.get("kind", "transformer") == "transformer":
        tokens = gh * gw + int(spec.get("num_prefix_tokens") or 0)
        grid = f"token grid {gh}x{gw} ({tokens:,} tokens)"
    else:
        grid = f"feature map {gh}x{gw}"
    return f"{h}x{w} px ({resize}), {grid}; preprocessing: {spec.get('preprocessing', 'not recorded')}"
