"""The input size a model runs at: set by the user (``--image-size``, ``load_model(..., image_size=)``) and said
in one line (the run's output and the report's summary)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace

from vitscope.errors import VitscopeUsageError, VitscopeValueError
from vitscope.models.backbone import Backbone
from vitscope.models.spec import ModelSpec, input_text

__all__ = ["describe_input", "keeping_aspect", "parse_image_size", "with_image_size"]


def parse_image_size(image_size: int | Sequence[int]) -> tuple[int, int]:
    """``32`` -> ``(32, 32)``; ``(32, 48)`` -> ``(32, 48)`` (height, width).

    Raises:
        VitscopeValueError: not one or two positive integers.
    """
    sides = [image_size] if isinstance(image_size, int) else list(image_size)
    if len(sides) not in (1, 2) or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sides):
        raise VitscopeValueError(f"image size must be a positive integer or (height, width), got {image_size!r}")
    return (sides[0], sides[-1])


def _size_text(size: Sequence[int]) -> str:
    return f"{size[0]} px" if size[0] == size[1] else f"{size[0]}x{size[1]} px"


def with_image_size(backbone: Backbone, image_size: int | Sequence[int]) -> Backbone:
    """``backbone`` run at ``image_size``: the centre crop becomes that size, the resize keeps its ratio to the crop
    (DINO's 256 -> 224 becomes 512 -> 448 at 448), the token grid follows and position embeddings are
    interpolated by the model. The given backbone is unchanged; the returned one shares its weights.

    Args:
        backbone: a loaded model.
        image_size: side in pixels, or ``(height, width)``.

    Returns:
        A Backbone whose spec has the new ``image_size``, ``grid`` and ``resize_size`` (images that keep their
        aspect ratio: a token budget of the new grid's patches), and whose ``spec.preprocessing`` says the size
        was set by the user.

    Raises:
        VitscopeValueError: a transformer whose patch size does not divide the size, or a model that runs at
            one size only.
    """
    size = parse_image_size(image_size)
    spec = backbone.spec
    if spec.is_transformer:
        p = spec.patch_size
        if size[0] % p or size[1] % p:
            near = sorted({max(p, s // p * p) for s in size} | {-(-s // p) * p for s in size})
            raise VitscopeUsageError(f"image size {_size_text(size)} is not a multiple of {spec.name}'s patch size "
                                     f"{p} px; use {' or '.join(map(str, near))}")
        if not backbone.resizable_input:
            raise VitscopeUsageError(f"{spec.name} runs at {_size_text(spec.image_size)} only (its position "
                                     "embeddings are not interpolated); leave out the image size")
    resize: int | tuple[int, int] | None = None
    if isinstance(spec.resize_size, (tuple, list)):  # the whole image to a fixed size: each side keeps its ratio
        resize = (round(spec.resize_size[0] * size[0] / spec.image_size[0]),
                  round(spec.resize_size[1] * size[1] / spec.image_size[1]))
    elif spec.resize_size:
        resize = round(spec.resize_size * max(size) / max(spec.image_size))
    resized = copy.copy(backbone)
    grid = tuple(backbone.grid_at(size))
    budget = grid[0] * grid[1] if spec.max_tokens else None  # images keeping their aspect: as many patches
    resized.spec = replace(spec, image_size=size, grid=grid, resize_size=None if budget else resize, max_tokens=budget,
                           preprocessing=f"{spec.preprocessing}; input size {_size_text(size)} set by the user")
    return resized


def keeping_aspect(backbone: Backbone, max_tokens: int | None = None) -> Backbone:
    """``backbone`` run on every image at its own aspect ratio (``--keep-aspect``): no centre crop; each image is
    resized to the largest multiple of the patch size on each side with at most ``max_tokens`` patches (default:
    the patches of the model's square input, so an image costs what it cost before), SigLIP 2 NaFlex's rule
    (:func:`~vitscope.models.preprocess.aspect_size`). Images of one run then have different token grids:
    ``vitscope.run`` groups each batch by grid. The given backbone is unchanged; the returned one shares its weights.

    Raises:
        VitscopeValueError: a CNN, or a model whose position embeddings are not interpolated.
    """
    spec = backbone.spec
    if not spec.is_transformer:
        raise VitscopeValueError(f"{spec.name} is a CNN; --keep-aspect applies to vision transformers (a CNN's "
                                 "feature map follows any input size: use --image-size)")
    if not backbone.resizable_input:
        raise VitscopeValueError(f"{spec.name} runs at {_size_text(spec.image_size)} only (its position embeddings "
                                 "are not interpolated), so it cannot keep each image's aspect ratio")
    budget = int(max_tokens or spec.grid[0] * spec.grid[1])
    if budget < 1:
        raise VitscopeValueError(f"the token budget must be at least 1, got {max_tokens}")
    kept = copy.copy(backbone)
    kept.spec = replace(spec, max_tokens=budget, resize_size=None,
                        preprocessing=f"{spec.preprocessing}; aspect ratio kept (at most {budget:,} patches)")
    return kept


def describe_input(spec: ModelSpec) -> str:
    """``NAME: input ...``: the size, token grid and origin of the preprocessing (:func:`input_text`)."""
    return f"{spec.name}: input {input_text(spec.to_dict())}"
