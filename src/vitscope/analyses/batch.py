"""What the engine hands every analysis with the recorded tensors: the :class:`Batch`, the work its analyses
share, and the model for extra forwards.

Several analyses read the same per-batch quantities: every attention analysis reads the statistics of
every block's pattern, interrelation and interrelation masking read the SIFT keypoints of every image. An
analysis declares what it reads (:meth:`~vitscope.analyses.base.Analysis.shared_quantities`); the engine
takes the union over the run's analyses (the *plan*) and hands each batch a :class:`SharedQuantities` that
computes a quantity the first time an analysis asks for it, with everything the plan asks of it, and keeps
it for the other analyses of that batch only. Nothing outlives the batch; work buffers belong to the run
(:class:`~vitscope.functional.attention_blocks.Workspace`).

A quantity may have a part that needs only the image, not the model (:data:`LOADER_WORK`): the engine's
loader does it beside decoding (in its thread or worker processes), on the uint8 image it preprocessed, and the
batch carries the values as host data (``batch.targets[name]``); the quantity then reads them instead of
working in the hot loop.

Analyses that classify altered copies of the batch (masking) run the model through :class:`ModelRunner`,
which pauses the recording meanwhile: the batch's record stays as the engine recorded it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from vitscope.errors import VitscopeRuntimeError, VitscopeValueError
from vitscope.functional.attention_blocks import QUANTITIES, BlockStats, Workspace, block_statistics
from vitscope.functional.sift import sift_keypoint_counts
from vitscope.hooks.edits import running_images
from vitscope.hooks.names import split_block_name
from vitscope.models.spec import ModelSpec

if TYPE_CHECKING:  # annotations only
    from vitscope.models.backbone import Backbone

__all__ = ["ATTENTION_BLOCKS", "LOADER_WORK", "PROVIDERS", "SIFT_KEYPOINTS", "Batch", "ModelRunner",
           "SharedQuantities", "image_keypoint_counts", "loader_work", "recorded_patterns", "thumbnails", "union_plan"]

T = TypeVar("T")


@dataclass
class Batch:
    """What the engine hands to every analysis together with the recorded tensors.

    Attributes:
        pixels: ``[B, 3, H, W]`` preprocessed input (on the run's device).
        indices: dataset index of each image.
        paths: source path (or name) of each image.
        spec: the backbone's ModelSpec.
        grid: ``(h, w)`` token grid of this batch's input size.
        targets: optional per-image ground truth (labels, masks...) from the dataset, and what the loader made
            per image (``target_transforms``, ``image_transforms``, :data:`LOADER_WORK`): host data, one value per
            image.
        shared: the batch's shared quantities (:class:`SharedQuantities`); the engine sets it with the run's
            plan, :meth:`quantity` creates one when it is missing.
        model: runs the model again on altered inputs (:class:`ModelRunner`); the engine sets it, analyses that
            re-run the model (masking) read it.
        frame: under a view (:mod:`vitscope.models.views`), how an original image, or a mask as a mode ``"L"``
            image, becomes the model's input frame: ``frame(image, resample) -> image``; None: the model's own
            resize and crop. Ground truth made from the original images follows it.
    """

    pixels: torch.Tensor
    indices: list[int]
    paths: list[str]
    spec: ModelSpec
    grid: tuple[int, int]
    targets: dict[str, Any] = field(default_factory=dict)
    shared: Any = field(default=None, repr=False)
    model: Any = field(default=None, repr=False)
    frame: Callable[..., Any] | None = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return len(self.indices)

    def quantity(self, name: str, record: Mapping[str, torch.Tensor], needs: Collection[str] = ()) -> Any:
        """A shared quantity of this batch (``"attention_blocks"``, ``"sift_keypoints"``), computed once.

        Args:
            name: the quantity (:data:`PROVIDERS`).
            record: the batch's recorded tensors.
            needs: options the caller reads (e.g. ``{"cls", "aligned"}`` of the attention blocks).
        """
        if self.shared is None:
            self.shared = SharedQuantities(record)
        return self.shared.get(name, self, needs)


def thumbnails(batch: Batch, positions: Sequence[int]) -> list[torch.Tensor]:
    """The preprocessed images at ``positions`` of the batch as ``[H, W, 3]`` uint8 on the pixels' device (for
    overlays and SIFT)."""
    spec = batch.spec
    mean = torch.tensor(spec.mean, dtype=torch.float32, device=batch.pixels.device).view(3, 1, 1)
    std = torch.tensor(spec.std, dtype=torch.float32, device=batch.pixels.device).view(3, 1, 1)
    out = []
    for i in positions:
        x = batch.pixels[i].detach().float() * std + mean
        out.append((x.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous())
    return out


ATTENTION_BLOCKS = "attention_blocks"
SIFT_KEYPOINTS = "sift_keypoints"
PATTERN_HOOKS = "blocks.*.attn.pattern"


def recorded_patterns(record: Mapping[str, torch.Tensor]) -> list[tuple[int, str]]:
    """``(block, hook name)`` of every attention pattern in the record, blocks in increasing order."""
    found = []
    for key in record:
        where = split_block_name(key)
        if where is not None and fnmatch.fnmatchcase(key, PATTERN_HOOKS):
            found.append((where[0], key))
    return sorted(found)


def _values(pattern: torch.Tensor, key: str) -> torch.Tensor:
    if pattern.is_meta:
        raise VitscopeRuntimeError(f"'{key}' was reduced as the model made it and its values are gone; an analysis "
                                   "that reads it in update() must list it in record_reads(), or ask for the quantity "
                                   "in shared_quantities() so the engine computes it in flight")
    return pattern


def _attention_blocks(record: Mapping[str, torch.Tensor], batch: Batch, needs: frozenset[str],
                      workspace: Workspace, held: dict[int, BlockStats] | None, compiled: bool = False
                      ) -> dict[int, BlockStats]:
    """Block index -> :class:`BlockStats` of every recorded pattern (``held``: computed before, completed;
    ``compiled``: through ``torch.compile``)."""
    needs = needs if batch.spec.has_cls_token else needs - {"cls"}
    out = dict(held or {})
    for key in record:
        where = split_block_name(key)
        if where is None or not fnmatch.fnmatchcase(key, PATTERN_HOOKS):
            continue
        block = where[0]
        have = out[block].have() if block in out else frozenset()
        missing = needs - have
        if block not in out or missing:
            stats = block_statistics(_values(record[key], key), batch.grid, batch.spec.num_prefix_tokens, missing,
                                     workspace, compiled)
            if block in out:
                out[block].update_from(stats)
            else:
                out[block] = stats
    return out


def image_keypoint_counts(image: np.ndarray, spec: ModelSpec) -> np.ndarray:
    """SIFT keypoints per patch of one preprocessed image on its own token grid: the loader's part of
    ``"sift_keypoints"``.

    Args:
        image: ``[H, W, 3]`` uint8, the image as the loader resized and cropped it (before normalisation).
        spec: the model's spec (its patch size gives the grid of an ``H x W`` input).

    Returns:
        ``[h, w]`` int64 counts (host data).
    """
    grid = spec.grid_for(*image.shape[:2])
    return sift_keypoint_counts(image, grid).numpy()


def _loaded_keypoints(batch: Batch, grid: tuple[int, int]) -> torch.Tensor | None:
    """The loader's keypoint counts of every image of the batch as ``[B, h, w]`` int64 (CPU), or None when the
    batch does not carry them for every image on this grid."""
    ready = batch.targets.get(SIFT_KEYPOINTS)
    if ready is None or len(ready) != batch.size or any(
            not isinstance(r, np.ndarray) or r.shape != grid for r in ready):
        return None
    return torch.from_numpy(np.stack(ready).astype(np.int64, copy=False))


def _sift_keypoints(record: Mapping[str, torch.Tensor], batch: Batch, needs: frozenset[str], workspace: Workspace,
                    held: torch.Tensor | None, compiled: bool = False) -> torch.Tensor:
    """SIFT keypoints per patch of every image at model resolution: ``[B, h, w]`` int64 (CPU).

    The loader's counts when the batch carries them (host data, no wait for the device); otherwise (a view, or a
    backbone's own preprocessing) counted here on the thumbnails, which are the loader's uint8 pixels again.
    """
    if held is not None:
        return held
    grid = (int(batch.grid[0]), int(batch.grid[1]))
    loaded = _loaded_keypoints(batch, grid)
    if loaded is not None:
        return loaded
    images = thumbnails(batch, range(batch.size))
    if not images:
        return torch.zeros(0, *grid, dtype=torch.int64)
    return torch.stack([sift_keypoint_counts(im.cpu().numpy(), grid) for im in images])  # OpenCV: host work


#: quantity name -> ``provider(record, batch, needs, workspace, held, compiled) -> value`` (``held``: what an
#: earlier call of this batch computed, for providers whose options can grow; ``compiled``: the run's
#: ``compile_stats``, for providers whose maths ``torch.compile`` can fuse).
PROVIDERS: dict[str, Callable[..., Any]] = {ATTENTION_BLOCKS: _attention_blocks, SIFT_KEYPOINTS: _sift_keypoints}
#: the options a quantity accepts (None: it takes none)
OPTIONS: dict[str, frozenset[str] | None] = {ATTENTION_BLOCKS: QUANTITIES, SIFT_KEYPOINTS: None}
#: quantity name -> ``work(image, spec)``: its per-image part, done by the loader on the preprocessed ``[H, W, 3]``
#: uint8 image; the batch carries the values as ``targets[name]``, one per image
LOADER_WORK: dict[str, Callable[[np.ndarray, ModelSpec], Any]] = {SIFT_KEYPOINTS: image_keypoint_counts}


def loader_work(plan: Mapping[str, Collection[str]], spec: ModelSpec) -> dict[str, Callable[[np.ndarray], Any]]:
    """``{target: work(image)}``: the loader's part (:data:`LOADER_WORK`) of the planned quantities, for ``spec``."""
    return {name: functools.partial(LOADER_WORK[name], spec=spec) for name in plan if name in LOADER_WORK}


def union_plan(needs: Collection[Mapping[str, Collection[str]]]) -> dict[str, frozenset[str]]:
    """Merge every analysis's ``{quantity: options}`` into one plan (the union of the options per quantity)."""
    plan: dict[str, frozenset[str]] = {}
    for one in needs:
        for name, options in one.items():
            _check(name, options)
            plan[name] = plan.get(name, frozenset()) | frozenset(options)
    return plan


def _check(name: str, options: Collection[str]) -> None:
    if name not in PROVIDERS:
        raise VitscopeValueError(f"unknown shared quantity {name!r}; known: {', '.join(sorted(PROVIDERS))}")
    allowed = OPTIONS[name] or frozenset()
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise VitscopeValueError(f"shared quantity {name!r} has no option {unknown[0]!r}; known: {sorted(allowed)}")


class SharedQuantities:
    """The shared quantities of one batch, each computed once (with the run's plan) on first request.

    Args:
        record: the batch's recorded tensors.
        plan: quantity -> options the run's analyses need (:func:`union_plan`); a request for more computes
            the rest then.
        workspace: the run's work buffers (None: a private one).
        compiled: compute the attention statistics through ``torch.compile``
            (:func:`~vitscope.functional.attention_blocks.block_statistics`).
    """

    def __init__(self, record: Mapping[str, torch.Tensor], plan: Mapping[str, Collection[str]] | None = None,
                 workspace: Workspace | None = None, compiled: bool = False) -> None:
        self.record = record
        self.compiled = bool(compiled)
        self.plan = {k: frozenset(v) for k, v in (plan or {}).items()}
        self.workspace = workspace if workspace is not None else Workspace()
        self._values: dict[str, Any] = {}
        self._options: dict[str, frozenset[str]] = {}

    def add_block(self, block: int, pattern: torch.Tensor, batch: Batch) -> None:
        """Compute the planned per-block attention statistics of one block as the model makes its pattern."""
        needs = self.plan.get(ATTENTION_BLOCKS)
        if needs is None:
            return
        needs = needs if batch.spec.has_cls_token else needs - {"cls"}
        held = self._values.setdefault(ATTENTION_BLOCKS, {})
        held[block] = block_statistics(pattern, batch.grid, batch.spec.num_prefix_tokens, needs, self.workspace,
                                       self.compiled)
        self._options[ATTENTION_BLOCKS] = self.plan[ATTENTION_BLOCKS]

    def get(self, name: str, batch: Batch, needs: Collection[str] = ()) -> Any:
        """The quantity ``name`` of this batch with at least the options ``needs`` (shared: do not modify it)."""
        needs = frozenset(needs)
        _check(name, needs)
        have = self._options.get(name)
        if have is None or not needs <= have:
            want = needs | self.plan.get(name, frozenset()) | (have or frozenset())
            self._values[name] = PROVIDERS[name](self.record, batch, want, self.workspace, self._values.get(name),
                                                 self.compiled)
            self._options[name] = want
        return self._values[name]


class ModelRunner:
    """Runs the model of the pass again on altered inputs, recording nothing meanwhile.

    Args:
        backbone: the model the engine runs.
        record: the engine's record, paused during the extra forwards (None: nothing to pause).
        indices: the dataset indices of the batch's images, in order: inside :meth:`run` they are
            :func:`~vitscope.hooks.edits.images_running`, so a resampling edit picks its reference by image, not
            by place in the batch (None: left as the caller set it).
    """

    def __init__(self, backbone: Backbone, record: Any = None, indices: Sequence[int] | None = None) -> None:
        self.backbone = backbone
        self.record = record
        self.indices = None if indices is None else tuple(int(i) for i in indices)

    @property
    def spec(self):
        return self.backbone.spec

    def run(self, fn: Callable[[Backbone], T]) -> T:
        """``fn(backbone)`` under ``torch.inference_mode`` with the recording paused."""
        paused = getattr(self.record, "paused", None)
        with torch.inference_mode(), \
                running_images(self.indices) if self.indices is not None else contextlib.nullcontext():
            if paused is None:
                return fn(self.backbone)
            with paused():
                return fn(self.backbone)

    def logits(self, pixels: torch.Tensor) -> torch.Tensor:
        """The classifier's logits on ``pixels`` ``[B, 3, H, W]``."""
        from vitscope.occlusion.forward import logits_of

        return logits_of(self.run(lambda b: b(pixels)))
