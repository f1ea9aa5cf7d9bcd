"""Video label propagation per block on DAVIS-format data (paper 002 figure 10 left, table 1).

docs/methods.md, Probes per block "Video label propagation", as the DINO code: context = the first frame and the 7
previous frames; top-5 context tokens within a window of Chebyshev radius 12 tokens; weights
``softmax(sim / 0.1)``; soft labels propagated frame after frame
(:func:`vitscope.functional.propagation.propagate_labels`); bilinear upsampling by the patch size,
per-channel min-max, argmax, nearest resize to the frame size. Evaluation as the official DAVIS 2017 code:
objects ``1 .. max`` of the first annotation; the first and the last frame dropped; J (region IoU) and F
(boundary F-measure) per object averaged over frames, then over every object of every sequence;
J&F = (J + F) / 2. Void pixels (255) count as background, as in the official semi-supervised evaluation
(``davis2017-evaluation`` passes no void mask): a predicted object pixel on void is a false positive and the
boundaries come from the unmasked masks. ``void="ignore"`` masks void out of both masks instead (the
convention of some papers' own evaluation code; it scores higher).

Features: the spatial tokens of every frame at every block, extracted once per sequence and cached
(:class:`FrameView`: short side to the model input unless ``short_side`` is given, as DINO's 480 for
224-pixel models; ``tiling=True`` for dense features, paper appendix B.4). Random chance: the same
propagation with U(0, 1) features.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from vitscope.analyses.probes.result import ProbeResult, probe_result
from vitscope.cache.feature_cache import FeatureCache, held_entries
from vitscope.cache.request import FeatureRequest
from vitscope.data.files import ImageFiles
from vitscope.data.images import ImageLoadError, oriented_size
from vitscope.data.orientation import exif_orientation, orient_array, oriented_hw
from vitscope.downstream.checks import require_blocks, tiling_scale
from vitscope.engine.extract import extract_features
from vitscope.errors import VitscopeValueError
from vitscope.functional.pooling import random_features
from vitscope.functional.propagation import first_frame_labels, labels_to_mask, propagate_labels
from vitscope.functional.video import davis_f, davis_j
from vitscope.models.backbone import Backbone
from vitscope.models.views import FrameView, TiledView

__all__ = ["davis_predictions", "davis_probe", "evaluate_sequence", "propagate_sequence"]

VOID = 255


def propagate_sequence(feats: np.ndarray | torch.Tensor, first_mask: np.ndarray, grid: tuple[int, int], patch: int,
                       frame_hw: tuple[int, int], num_context: int = 7, topk: int = 5, radius: int = 12,
                       temperature: float = 0.1) -> list[np.ndarray]:
    """Propagate the first frame's mask through a sequence (the DINO ``eval_video_tracking_davis`` loop).

    Args:
        feats: ``[T, K, D]`` spatial tokens of every frame (row-major ``h x w`` grid).
        first_mask: ``[H, W]`` object indices of frame 0 (0 = background).
        grid: ``(h, w)``; patch: upsampling factor from the grid to the token frame.
        frame_hw: ``(H, W)`` original frame size (predictions are resized to it).
        num_context: previous frames kept besides the first (7).
        topk, radius, temperature: propagation settings (5, 12, 0.1).

    Returns:
        ``T`` predicted ``[H, W]`` uint8 masks; frame 0's is the given annotation.
    """
    x = torch.as_tensor(np.array(feats, dtype=np.float32))
    labels = first_frame_labels(np.where(first_mask == VOID, 0, first_mask), grid).flatten(1)  # [M, K]
    queue: list[tuple[torch.Tensor, torch.Tensor]] = []
    preds = [np.asarray(first_mask, dtype=np.uint8)]
    for t in range(1, x.shape[0]):
        context = torch.stack([x[0]] + [f for f, _ in queue])
        context_labels = torch.stack([labels] + [s for _, s in queue])
        soft = propagate_labels(x[t], context, context_labels, grid, topk, radius, temperature)
        if len(queue) == num_context:
            queue.pop(0)
        queue.append((x[t], soft))
        preds.append(labels_to_mask(soft.reshape(-1, *grid), patch, frame_hw))
    return preds


VOID_RULES = ("background", "ignore")


def evaluate_sequence(preds: Sequence[np.ndarray], truth: np.ndarray, void: str = "background"
                      ) -> tuple[list[float], list[float]]:
    """Per-object mean J and F over frames 1 .. T-2, as the official DAVIS 2017 semi-supervised evaluation.

    Args:
        preds: T predicted ``[H, W]`` object-index masks.
        truth: ``[T, H, W]`` annotated object indices (255 = void).
        void: ``"background"`` (official: void is background, predictions on it count) or ``"ignore"`` (void
            pixels are removed from both masks).

    Returns:
        ``(J per object, F per object)`` for objects ``1 .. max(truth[0])`` (void excluded).
    """
    if void not in VOID_RULES:
        raise VitscopeValueError(f"void must be one of {', '.join(VOID_RULES)}, got {void!r}")
    truth = np.asarray(truth)
    num_objects = int(np.where(truth[0] == VOID, 0, truth[0]).max())
    frames = range(1, truth.shape[0] - 1)
    j_scores, f_scores = [], []
    for obj in range(1, num_objects + 1):
        js, fs = [], []
        for t in frames:
            gt, pr = truth[t] == obj, np.asarray(preds[t]) == obj
            if void == "ignore":
                keep = truth[t] != VOID
                gt, pr = gt & keep, pr & keep
            js.append(davis_j(pr, gt))
            fs.append(davis_f(pr, gt))
        if js:
            j_scores.append(float(np.mean(js)))
            f_scores.append(float(np.mean(fs)))
    return j_scores, f_scores


def _propagate(feats: np.ndarray, truth: np.ndarray, layout: dict, options: dict) -> list[np.ndarray]:
    """:func:`propagate_sequence` on the frames as decoded (EXIF-oriented, as their features are), the predictions
    taken back to the stored pixels the annotations are on."""
    turn = layout["orientation"]
    preds = propagate_sequence(feats, orient_array(truth[0], turn), layout["grid"], layout["patch"],
                               oriented_hw(truth.shape[1:], turn), **options)
    return [orient_array(p, turn, inverse=True) for p in preds]


def _scores(sequences: list[tuple[np.ndarray, dict]], features: Callable[[int], np.ndarray], options: dict,
            void: str = "background") -> dict[str, float]:
    j_all, f_all = [], []
    for s, (truth, layout) in enumerate(sequences):
        preds = _propagate(features(s), truth, layout, options)
        j, f = evaluate_sequence(preds, truth, void)
        j_all += j
        f_all += f
    j_mean = float(np.mean(j_all)) if j_all else float("nan")
    f_mean = float(np.mean(f_all)) if f_all else float("nan")
    return {"J&F": (j_mean + f_mean) / 2, "J": j_mean, "F": f_mean}


def _require_sequences(dataset: Any) -> None:
    if len(dataset) == 0 or not hasattr(dataset[0], "frame_paths"):
        raise VitscopeValueError("davis_probe needs a DAVIS-format dataset of sequences (load_dataset(root, 'davis'))")


def _view(short_side: int | None, tiling: bool | float) -> FrameView | TiledView:
    scale = tiling_scale(tiling)
    return TiledView(FrameView(short_side), scale) if scale else FrameView(short_side)


def _extraction(strict: bool, resume: bool, checkpoint_seconds: float) -> dict[str, Any]:
    """How each sequence's feature pass runs (:func:`~vitscope.engine.extract.extract_features`)."""
    return {"strict": strict, "resume": resume, "checkpoint_seconds": checkpoint_seconds}


def _sequence_features(backbone: Backbone, dataset: Any, request: FeatureRequest, cache: FeatureCache | None,
                       view: Any, batch_size: int, device: str | None, dtype: str | None, distributed: bool,
                       log: Callable[[str], None] | None, extraction: dict[str, Any]
                       ) -> tuple[list[Any], list[tuple[np.ndarray, dict]]]:
    """Every sequence's cached features and ``(annotations [T or 1, H, W], {"grid", "patch", "orientation"})``
    (the frames' EXIF orientation: features are of the oriented frames, annotations of the stored pixels);
    ``extraction``: strict, resume and checkpoint_seconds of each sequence's pass."""
    require_blocks(backbone, "DAVIS")
    entries, sequences = [], []
    for s in range(len(dataset)):
        seq = dataset[s]
        turns = sorted({exif_orientation(p) for p in seq.frame_paths})
        if len(turns) > 1:
            raise VitscopeValueError(f"sequence {seq.name}: its frames carry different EXIF orientations {turns}; "
                                     "propagation needs every frame turned the same way")
        _require_one_frame_size(seq)
        source = ImageFiles(list(seq.frame_paths), name=f"davis:{seq.name}")
        entry = extract_features(backbone, source, [request], cache, view, batch_size, device, dtype,
                                 distributed=distributed, log=log, **extraction)[request]
        if len(entry) != len(seq.frame_paths):
            raise VitscopeValueError(f"sequence {seq.name}: {len(seq.frame_paths) - len(entry)} frames could not be "
                                     "read")
        grid = tuple(entry.meta["grid"])
        patch = entry.meta["frame_hw"][0] // grid[0]
        entries.append(entry)
        sequences.append((seq.masks(), {"grid": grid, "patch": patch, "orientation": turns[0] if turns else 1}))
    return entries, sequences


def _require_one_frame_size(seq: Any) -> None:
    """Refuse a sequence whose frames differ in size (read from their headers), naming the first that differs:
    its features could not be compared with the first frame's."""
    first = None
    for path in seq.frame_paths:
        try:
            h, w = oriented_size(path)
        except ImageLoadError:  # unreadable: the feature pass reports it
            continue
        first = first or (path, (h, w))
        if (h, w) != first[1]:
            raise VitscopeValueError(f"sequence {seq.name}: frame {path} is {w}x{h} but {first[0]} is "
                                     f"{first[1][1]}x{first[1][0]}; propagation needs one frame size per sequence")


@held_entries()  # every sequence's entry stays until the last is scored
def davis_predictions(backbone: Backbone, dataset: Any, block: int, cache: FeatureCache | None = None,
                      site: str = "resid_post", short_side: int | None = None, tiling: bool | float = False,
                      num_context: int = 7, topk: int = 5, radius: int = 12, temperature: float = 0.1,
                      batch_size: int = 16, device: str | None = None, dtype: str | None = None,
                      distributed: bool = False, log: Callable[[str], None] | None = None,
                      strict: bool = False, resume: bool = True, checkpoint_seconds: float = 60.0) -> dict[str, bytes]:
    """The masks propagated from each sequence's first annotation at one block, as DAVIS palette PNGs.

    For splits that annotate only the first frame (test-dev, test-challenge): the official protocol scores
    the other frames on its server, so the masks are written in its format, one folder per sequence and one
    PNG per frame named as the frame (``<sequence>/00000.png``; frame 0 is the given annotation).

    Args:
        backbone: the model; block: the block whose features propagate the labels.
        dataset: a DAVIS reader (any split; fully annotated splits use only their first annotation).
        cache, site, short_side, tiling, num_context, topk, radius, temperature, batch_size, device, dtype,
            distributed, log, strict, resume, checkpoint_seconds: as :func:`davis_probe`.

    Returns:
        ``{"<sequence>/<frame>.png": PNG bytes}`` in sequence and frame order.
    """
    import io
    from pathlib import Path

    from vitscope.data.formats.davis import palette_png

    _require_sequences(dataset)
    request = FeatureRequest(site, "spatial", (int(block),))
    entries, sequences = _sequence_features(backbone, dataset, request, cache, _view(short_side, tiling),
                                            batch_size, device, dtype, distributed, log,
                                            _extraction(strict, resume, checkpoint_seconds))
    options = {"num_context": num_context, "topk": topk, "radius": radius, "temperature": temperature}
    files: dict[str, bytes] = {}
    for s, (entry, (truth, layout)) in enumerate(zip(entries, sequences)):
        seq = dataset[s]
        preds = _propagate(np.asarray(entry.block(int(block))), truth, layout, options)
        for frame, pred in zip(seq.frame_paths, preds):
            buffer = io.BytesIO()
            palette_png(pred, buffer)
            files[f"{seq.name}/{Path(frame).stem}.png"] = buffer.getvalue()
    return files


@held_entries()  # every sequence's entry stays until the last is scored
def davis_probe(backbone: Backbone, dataset, cache: FeatureCache | None = None, site: str = "resid_post",
                blocks: Sequence[int] | None = None, short_side: int | None = None, tiling: bool | float = False,
                num_context: int = 7, topk: int = 5, radius: int = 12, temperature: float = 0.1, seed: int = 0,
                random_kind: str | None = "uniform", batch_size: int = 16, device: str | None = None,
                dtype: str | None = None, distributed: bool = False,
                log: Callable[[str], None] | None = None, void: str = "background", strict: bool = False,
                resume: bool = True, checkpoint_seconds: float = 60.0) -> ProbeResult:
    """DAVIS J, F and J&F of label propagation at every block.

    Args:
        backbone: the model.
        dataset: a :class:`~vitscope.data.formats.davis.DavisDataset` (sequences with ``frame_paths`` and
            annotations).
        cache: feature cache (default location if None); features are cached per sequence.
        site: block site; blocks: blocks to score (default all).
        short_side: frame short side in pixels (default: the model input's; DINO: 480).
        tiling: dense features by tiling the resized frame (paper appendix B.4): True = frames at twice the
            size (the paper), a number = that scale, False = none.
        num_context, topk, radius, temperature: propagation settings.
        seed, random_kind: random-chance features (None: no baseline).
        batch_size, device, dtype: extraction settings.
        distributed: share the extraction with the processes of the ``torch.distributed`` group (every process
            returns the same result; the feature cache folder must be one they all see).
        log: receives one-line messages (an extraction that resumes says so).
        void: ``"background"`` (the official evaluation) or ``"ignore"`` (void masked out of both masks).
        strict, resume, checkpoint_seconds: how the extraction pass treats unreadable images and saved state
            (:func:`~vitscope.engine.extract.extract_features`).

    Returns:
        ProbeResult with ``J&F``, ``J``, ``F`` per block and their ``random_*``.
    """
    if void not in VOID_RULES:
        raise VitscopeValueError(f"void must be one of {', '.join(VOID_RULES)}, got {void!r}")
    _require_sequences(dataset)
    if getattr(dataset, "first_frame_only", False):
        raise VitscopeValueError(f"{getattr(dataset, 'name', 'this DAVIS split')} annotates only the first frame of "
                                 "each sequence: J and F cannot be computed; use davis_predictions to write the "
                                 "propagated masks for the official evaluation")
    spec = backbone.spec
    view = _view(short_side, tiling)
    request = FeatureRequest(site, "spatial", None if blocks is None else tuple(blocks))
    entries, sequences = _sequence_features(backbone, dataset, request, cache, view, batch_size, device, dtype,
                                            distributed, log, _extraction(strict, resume, checkpoint_seconds))
    options = {"num_context": num_context, "topk": topk, "radius": radius, "temperature": temperature}
    block_list = request.block_list(spec.num_blocks)
    scores: dict[str, list[float]] = {"J&F": [], "J": [], "F": []}
    for b in block_list:
        for k, v in _scores(sequences, lambda s, b=b: np.asarray(entries[s].block(b)), options, void).items():
            scores[k].append(v)
    random = None
    if random_kind is not None:
        gen = torch.Generator().manual_seed(seed)
        noise = [random_features(entries[s].block(block_list[0]).shape, gen, random_kind).numpy()
                 for s in range(len(entries))]
        random = _scores(sequences, noise.__getitem__, options, void)
    return probe_result("davis", "davis", block_list, scores, random, model=spec.name, view=view.describe(spec),
                        num_sequences=len(entries), random_kind=random_kind, void=void, **options)
