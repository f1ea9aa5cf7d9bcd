"""Views: how images become model inputs for feature extraction, and how ground truth follows them.

A view fixes the geometry from an original image to the *token frame*: the pixel frame in which token
``(r, c)`` covers pixels ``[r*p, (r+1)*p) x [c*p, (c+1)*p)``. Masks and keypoints go through the same
geometry (docs/methods.md, Shared rules). Views:

- :class:`StandardView`: the model's own preprocessing (resize the short side, centre crop).
- :class:`LongSideView`: retrieval (docs/methods.md, Probes per block): first reduce the image so its long side is the
  model input, then the model's preprocessing.
- :class:`LetterboxView`: SPair (the 002 code): the long side fills the model input, the rest is black.
- :class:`FrameView`: DAVIS frames (the DINO code): short side resized to ``short_side``, long side floored
  to a multiple of ``multiple``; the whole frame goes through the model at that size.
- :class:`TiledView`: dense features by tiling (appendix B.4) of what another view produces.

Every view's ``describe(spec)`` is part of the feature-cache key.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from PIL import Image

from vitscope.functional.correspondence import letterbox_geometry
from vitscope.functional.tiling import stitch_tiles, tiling_plan
from vitscope.hooks.tokens import tokens_to_grid
from vitscope.models.preprocess import resample_filter, resize_crop, resize_crop_geometry
from vitscope.models.spec import ModelSpec

__all__ = ["FrameView", "LetterboxView", "LongSideView", "StandardView", "TiledView", "TokenGroup", "View"]

#: ``(pixels [B, 3, H, W], positions) -> {hook: [B, N, D]}``; ``positions[j]``: the place in the batch given to
#: ``View.tokens`` of the image row ``j`` comes from (a tiled image repeats its place once per tile)
Forward = Callable[[torch.Tensor, Sequence[int]], dict[str, torch.Tensor]]


@dataclass
class TokenGroup:
    """Tokens of some images of a batch that share one layout.

    Attributes:
        positions: positions of these images in the batch given to ``View.tokens``.
        tokens: ``{hook: [b, N, D]}``.
        num_prefix: prefix tokens at the start of each sequence (0 for tiled features).
        grid: ``(h, w)`` spatial grid.
        frame_hw: ``(H, W)`` of the token frame in pixels.
        pixels: ``[b, 3, H, W]`` model input of these images (None when it is not one batch, e.g. tiles).
    """

    positions: list[int]
    tokens: dict[str, torch.Tensor]
    num_prefix: int
    grid: tuple[int, int]
    frame_hw: tuple[int, int]
    pixels: torch.Tensor | None = None


def normalise(images: list[Image.Image], spec: ModelSpec) -> torch.Tensor:
    """RGB images of one size -> ``[B, 3, H, W]`` float32 with the model's mean and std (no resizing)."""
    x = torch.from_numpy(np.stack([np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0 for im in images]))
    x = x.permute(0, 3, 1, 2).contiguous()
    mean = torch.tensor(spec.mean, dtype=torch.float32).view(1, 3, 1, 1)
    std = torch.tensor(spec.std, dtype=torch.float32).view(1, 3, 1, 1)
    return (x - mean) / std


def _rescale(xy: np.ndarray, from_hw: tuple[int, int], to_hw: tuple[int, int]) -> np.ndarray:
    """``[n, 2]`` (x, y) pixels of a ``from_hw`` image -> the same places after resizing it to ``to_hw``."""
    pts = np.asarray(xy, dtype=np.float64).reshape(-1, 2)
    return pts * np.array([to_hw[1] / from_hw[1], to_hw[0] / from_hw[0]])


def _resize_crop_points(xy: np.ndarray, image_hw: tuple[int, int], spec: ModelSpec) -> np.ndarray:
    new_hw, left, top = resize_crop_geometry(image_hw, spec)
    return _rescale(xy, image_hw, new_hw) - np.array([left, top])


class View(ABC):
    """Geometry from an original image to the token frame, and the forward passes that go with it."""

    name: str = "view"
    #: whether its batches carry the model's input pixels (``Batch.pixels``); a tiled view's stitched grids come
    #: from several forwards per image and carry none
    gives_pixels: ClassVar[bool] = True

    @abstractmethod
    def describe(self, spec: ModelSpec) -> dict:
        """JSON-able description (part of the cache key)."""

    @abstractmethod
    def transform(self, image: Image.Image, spec: ModelSpec, resample: Image.Resampling | None = None) -> Image.Image:
        """Map an original image (or a mask as a mode ``"L"`` image) into the frame fed to the model."""

    @abstractmethod
    def points(self, xy: np.ndarray, image_hw: tuple[int, int], spec: ModelSpec) -> np.ndarray:
        """Map ``[n, 2]`` (x, y) pixels of an original ``image_hw`` image into the token frame."""

    def tokens(self, images: list[Image.Image], spec: ModelSpec, forward: Forward) -> list[TokenGroup]:
        """Run the model on ``images`` (grouped by frame size) and return their tokens."""
        frames = [self.transform(im, spec) for im in images]
        groups: dict[tuple[int, int], list[int]] = {}
        for i, f in enumerate(frames):
            groups.setdefault((f.height, f.width), []).append(i)
        out = []
        for (h, w), positions in groups.items():
            pixels = normalise([frames[i] for i in positions], spec)
            out.append(TokenGroup(positions, forward(pixels, positions), spec.num_prefix_tokens,
                                  spec.grid_for(h, w), (h, w), pixels))
        return out

    def mask_frame(self, masks: np.ndarray, spec: ModelSpec) -> np.ndarray:
        """``[M, H, W]`` bool masks of an original image -> ``[M, H', W']`` float coverage in the token frame."""
        out = [np.asarray(self.transform(Image.fromarray(m.astype(np.uint8) * 255), spec, Image.Resampling.BILINEAR),
                          dtype=np.float32) / 255.0 for m in np.asarray(masks)]
        return np.stack(out) if out else np.zeros((0, 1, 1), dtype=np.float32)


@dataclass(frozen=True)
class StandardView(View):
    """The model's own preprocessing (``Backbone.preprocess``): resize the short side, centre crop."""

    name: str = "standard"

    def describe(self, spec: ModelSpec) -> dict:
        return {"view": self.name, "image_size": spec.image_size, "resize_size": spec.resize_size,
                "interpolation": spec.interpolation, "mean": spec.mean, "std": spec.std}

    def transform(self, image: Image.Image, spec: ModelSpec, resample: Image.Resampling | None = None) -> Image.Image:
        return resize_crop(image, spec, resample)

    def points(self, xy: np.ndarray, image_hw: tuple[int, int], spec: ModelSpec) -> np.ndarray:
        return _resize_crop_points(xy, image_hw, spec)


@dataclass(frozen=True)
class LongSideView(View):
    """Retrieval preprocessing: reduce so the long side is the model input, then the model's preprocessing."""

    name: str = "long_side"

    def describe(self, spec: ModelSpec) -> dict:
        return {**StandardView().describe(spec), "view": self.name}

    @staticmethod
    def reduced(image_hw: tuple[int, int], spec: ModelSpec) -> tuple[int, int]:
        """``(height, width)`` after the reduction (images already small enough are not enlarged)."""
        side = max(spec.image_size)
        h, w = image_hw
        if max(w, h) <= side:
            return h, w
        s = side / max(w, h)
        return max(1, round(h * s)), max(1, round(w * s))

    def transform(self, image: Image.Image, spec: ModelSpec, resample: Image.Resampling | None = None) -> Image.Image:
        h, w = self.reduced((image.height, image.width), spec)
        if (h, w) != (image.height, image.width):
            filt = resample if resample is not None else resample_filter(spec.interpolation)
            image = image.resize((w, h), filt)
        return resize_crop(image, spec, resample)

    def points(self, xy: np.ndarray, image_hw: tuple[int, int], spec: ModelSpec) -> np.ndarray:
        hw = self.reduced(image_hw, spec)
        return _resize_crop_points(_rescale(xy, image_hw, hw), hw, spec)


@dataclass(frozen=True)
class LetterboxView(View):
    """SPair preprocessing of the 002 code: long side to the model input (LANCZOS), centred on black."""

    name: str = "letterbox"

    def describe(self, spec: ModelSpec) -> dict:
        return {"view": self.name, "image_size": spec.image_size, "mean": spec.mean, "std": spec.std}

    def transform(self, image: Image.Image, spec: ModelSpec, resample: Image.Resampling | None = None) -> Image.Image:
        box = letterbox_geometry((image.height, image.width), spec.image_size)
        new_h, new_w = box.new_size
        resized = image.resize((new_w, new_h), resample if resample is not None else Image.Resampling.LANCZOS)
        canvas = Image.new(image.mode, (spec.image_size[1], spec.image_size[0]), 0)
        canvas.paste(resized, (box.left, box.top))
        return canvas

    def points(self, xy: np.ndarray, image_hw: tuple[int, int], spec: ModelSpec) -> np.ndarray:
        return letterbox_geometry(image_hw, spec.image_size).apply(xy)


@dataclass(frozen=True)
class FrameView(View):
    """DAVIS frames as the DINO code: short side to ``short_side``, long side floored to ``multiple``.

    Args:
        short_side: pixels of the short side; None = the model input's short side (DINO used 480 with
            224-pixel models).
        multiple: the long side is floored to a multiple of this (DINO: 64).
    """

    short_side: int | None = None
    multiple: int = 64
    name: str = "frame"

    def size(self, image_hw: tuple[int, int], spec: ModelSpec) -> tuple[int, int]:
        """``(height, width)`` a frame of ``image_hw`` is resized to."""
        h, w = image_hw
        short = self.short_side or min(spec.image_size)
        if h > w:
            return max(self.multiple, int(short * h / w // self.multiple * self.multiple)), short
        return short, max(self.multiple, int(short * w / h // self.multiple * self.multiple))

    def describe(self, spec: ModelSpec) -> dict:
        return {"view": self.name, "short_side": self.short_side or min(spec.image_size), "multiple": self.multiple,
                "mean": spec.mean, "std": spec.std}

    def transform(self, image: Image.Image, spec: ModelSpec, resample: Image.Resampling | None = None) -> Image.Image:
        h, w = self.size((image.height, image.width), spec)
        return image.resize((w, h), resample if resample is not None else Image.Resampling.BILINEAR)

    def points(self, xy: np.ndarray, image_hw: tuple[int, int], spec: ModelSpec) -> np.ndarray:
        return _rescale(xy, image_hw, self.size(image_hw, spec))


@dataclass(frozen=True)
class TiledView(View):
    """Dense features by tiling (:mod:`vitscope.functional.tiling`) of the frame another view produces.

    Each image is resized to ``scale`` times the model input (short side) and cut into input-size tiles;
    the tiles' spatial tokens are stitched into one grid (prefix tokens are dropped: ``num_prefix = 0``).

    Args:
        inner: the view whose output is tiled (default: the original image, untouched).
        scale: short side after resizing, in model inputs (paper: 2).
        resample: PIL filter of that resize.
    """

    inner: View | None = None
    scale: float = 2.0
    resample: str = "bicubic"
    name: str = "tiled"
    gives_pixels: ClassVar[bool] = False

    def describe(self, spec: ModelSpec) -> dict:
        inner = self.inner.describe(spec) if self.inner is not None else {"view": "original"}
        return {"view": self.name, "scale": self.scale, "inner": inner, "image_size": spec.image_size,
                "patch": spec.patch_size, "mean": spec.mean, "std": spec.std, "resample": self.resample}

    def _plan(self, image: Image.Image, spec: ModelSpec):
        return tiling_plan((image.height, image.width), spec.image_size, spec.patch_size, self.scale)

    def transform(self, image: Image.Image, spec: ModelSpec, resample: Image.Resampling | None = None) -> Image.Image:
        if self.inner is not None:
            image = self.inner.transform(image, spec, resample)
        h, w = self._plan(image, spec).resized
        return image.resize((w, h), resample if resample is not None else resample_filter(self.resample))

    def points(self, xy: np.ndarray, image_hw: tuple[int, int], spec: ModelSpec) -> np.ndarray:
        pts, hw = np.asarray(xy, dtype=np.float64).reshape(-1, 2), image_hw
        if self.inner is not None:
            pts = self.inner.points(pts, image_hw, spec)
            probe = self.inner.transform(Image.new("L", (image_hw[1], image_hw[0])), spec)
            hw = (probe.height, probe.width)
        return _rescale(pts, hw, tiling_plan(hw, spec.image_size, spec.patch_size, self.scale).resized)

    def tokens(self, images: list[Image.Image], spec: ModelSpec, forward: Forward) -> list[TokenGroup]:
        out = []
        th, tw = spec.image_size
        for i, image in enumerate(images):
            base = self.inner.transform(image, spec) if self.inner is not None else image
            plan = self._plan(base, spec)
            big = self.transform(image, spec)
            tiles = [big.crop((left, top, left + tw, top + th)) for top, left in plan.origins]
            recorded = forward(normalise(tiles, spec), [i] * len(tiles))
            dense = {}
            for hook, t in recorded.items():
                grid = tokens_to_grid(t, spec.grid_for(th, tw), spec.num_prefix_tokens)  # [T, D, th/p, tw/p]
                d = stitch_tiles(grid, plan)  # [D, gh, gw]
                dense[hook] = d.flatten(1).T.unsqueeze(0)  # [1, gh*gw, D]
            out.append(TokenGroup([i], dense, 0, plan.grid, plan.resized))
        return out

