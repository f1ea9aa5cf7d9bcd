"""Keypoint correspondence per block on SPair-format pairs (paper 002 figure 10 right, appendix E.1).

docs/methods.md, Probes per block "Keypoint correspondence", as the 002 code (``run_kp_analysis.py``): both images
letterboxed to the model input; spatial tokens L2-normalised and upsampled bilinearly to pixels; each
source keypoint matched to the best target pixel (:func:`vitscope.functional.correspondence.transfer_keypoints`);
correct when the error is strictly below ``alpha * max(h, w)`` of the target box in the letterboxed frame
(``normaliser="image"``: the letterboxed image's long side, as the paper's text); PCK pools keypoints within
a category, then averages categories; ``pairs_per_category`` pairs drawn with replacement per category
(categories sorted, one ``RandomState(seed)`` drawn in turn, seed 42 as the code). Only keypoints visible
in both images count (the SPair reader keeps exactly those). Random chance: U(0, 1) features.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from PIL import Image

from vitscope.analyses.probes.result import ProbeResult, probe_result
from vitscope.cache.feature_cache import FeatureCache
from vitscope.cache.request import FeatureRequest
from vitscope.data.files import ImageFiles
from vitscope.data.orientation import exif_orientation, orient_points, oriented_hw
from vitscope.downstream.checks import require_blocks, tiling_scale
from vitscope.engine.extract import extract_features
from vitscope.errors import VitscopeValueError
from vitscope.functional.correspondence import letterbox_geometry, transfer_keypoints
from vitscope.functional.keypoints import pck
from vitscope.functional.pooling import random_features
from vitscope.models.backbone import Backbone
from vitscope.models.views import LetterboxView, TiledView

__all__ = ["keypoint_probe", "sample_pairs"]

ALPHAS = (0.1, 0.05, 0.01)


def sample_pairs(categories: Sequence[str], pairs_per_category: int | None, seed: int = 42) -> list[int]:
    """Positions of the evaluated pairs: per sorted category, ``pairs_per_category`` drawn with replacement.

    Args:
        categories: category of every pair, in dataset order.
        pairs_per_category: draws per category (None: every pair once, in order).
        seed: seed of the one ``numpy.random.RandomState`` used for all categories in turn.

    Returns:
        Pair positions, grouped by category.
    """
    rng = np.random.RandomState(seed)
    out: list[int] = []
    for cat in sorted(set(categories)):
        members = [i for i, c in enumerate(categories) if c == cat]
        if pairs_per_category is None:
            out += members
        else:
            out += [members[j] for j in rng.choice(len(members), pairs_per_category)]
    return out


def _pck(pairs: list[dict], tokens: Callable[[str], torch.Tensor], canvas: tuple[int, int],
         alphas: Sequence[float]) -> dict[str, float]:
    """PCK per alpha: keypoints pooled within a category, then the mean over categories."""
    per_cat: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    done: dict[int, np.ndarray] = {}  # pairs drawn more than once are transferred once
    for p in pairs:
        if p["pair"] not in done:
            done[p["pair"]] = transfer_keypoints(tokens(p["src"]), tokens(p["trg"]), p["src_xy"], canvas).numpy()
        pred = done[p["pair"]]
        per_cat.setdefault(p["category"], []).append((pred, p["trg_xy"], np.full(len(pred), p["threshold"])))
    out = {}
    for alpha in alphas:
        scores = []
        for rows in per_cat.values():
            pred = np.concatenate([r[0] for r in rows])
            if len(pred):
                scores.append(pck(pred, np.concatenate([r[1] for r in rows]), np.concatenate([r[2] for r in rows]),
                                  alpha))
        out[f"PCK@{alpha:g}"] = float(np.mean(scores)) if scores else float("nan")
    return out


def _shown(path: str, kps: np.ndarray) -> tuple[tuple[int, int], np.ndarray]:
    """``(height, width)`` of the image as decoded (EXIF-oriented, as its features are) and ``kps [n, 2]``, annotated
    on the stored pixels, where that image shows them."""
    with Image.open(path) as im:
        stored = (im.height, im.width)
    orientation = exif_orientation(path)
    return oriented_hw(stored, orientation), orient_points(np.asarray(kps).reshape(-1, 2), stored, orientation)


def keypoint_probe(backbone: Backbone, dataset, cache: FeatureCache | None = None, site: str = "resid_post",
                   blocks: Sequence[int] | None = None, pairs_per_category: int | None = 20, seed: int = 42,
                   alphas: Sequence[float] = ALPHAS, normaliser: str = "bbox", tiling: bool | float = False,
                   random_kind: str | None = "uniform", batch_size: int = 32, device: str | None = None,
                   dtype: str | None = None, distributed: bool = False,
                   log: Callable[[str], None] | None = None, strict: bool = False, resume: bool = True,
                   checkpoint_seconds: float = 60.0) -> ProbeResult:
    """SPair keypoint-transfer PCK at every block (every image's features extracted once, cached).

    Args:
        backbone: the model.
        dataset: a :class:`~vitscope.data.formats.spair.SPairDataset`.
        cache: feature cache (default location if None).
        site: block site; blocks: blocks to score (default all).
        pairs_per_category: pairs drawn per category with replacement (None: every pair once).
        seed: seed of the pair sampling and of the random features.
        alphas: PCK thresholds (default 0.1, 0.05, 0.01).
        normaliser: ``"bbox"`` (target box long side, the code) or ``"image"`` (letterboxed image long side).
        tiling: dense features by tiling the letterboxed image (paper appendix B.4): True = twice the size (the
            paper), a number = that scale, False = none.
        random_kind: random-chance features (None: no baseline).
        batch_size, device, dtype: extraction settings.
        distributed: share the extraction with the processes of the ``torch.distributed`` group (every process
            returns the same result; the feature cache folder must be one they all see).
        log: receives one-line messages (an extraction that resumes says so).
        strict, resume, checkpoint_seconds: how the extraction pass treats unreadable images and saved state
            (:func:`~vitscope.engine.extract.extract_features`).

    Returns:
        ProbeResult with ``PCK@0.1``, ``PCK@0.05``, ``PCK@0.01`` per block and their ``random_*``.
    """
    if normaliser not in ("bbox", "image"):
        raise VitscopeValueError(f"normaliser must be 'bbox' or 'image', got {normaliser!r}")
    if len(dataset) == 0 or not hasattr(dataset[0], "src_kps"):
        raise VitscopeValueError("keypoint_probe needs an SPair-format dataset of pairs (load_dataset(root, 'spair'))")
    require_blocks(backbone, "keypoint")
    scale = tiling_scale(tiling)
    spec = backbone.spec
    canvas = tuple(spec.image_size)
    items = [dataset[i] for i in range(len(dataset))]
    chosen = sample_pairs([it.category for it in items], pairs_per_category, seed)
    paths = list(dict.fromkeys(p for i in chosen for p in (items[i].src_path, items[i].trg_path)))
    pairs = []
    for i in chosen:
        it = items[i]
        src_hw, src_xy = _shown(it.src_path, it.src_kps)
        trg_hw, trg_xy = _shown(it.trg_path, it.trg_kps)
        src_box, trg_box = letterbox_geometry(src_hw, canvas), letterbox_geometry(trg_hw, canvas)
        box = np.asarray(it.trg_box, dtype=np.float64)
        bbox_side = max(box[2] - box[0], box[3] - box[1]) * trg_box.scale  # a turn swaps the sides, keeps the longer
        size = bbox_side if normaliser == "bbox" else max(trg_box.new_size)
        pairs.append({"pair": i, "src": it.src_path, "trg": it.trg_path, "category": it.category,
                      "threshold": float(size), "src_xy": src_box.apply(src_xy), "trg_xy": trg_box.apply(trg_xy)})
    view = TiledView(LetterboxView(), scale) if scale else LetterboxView()
    request = FeatureRequest(site, "spatial", None if blocks is None else tuple(blocks))
    entry = extract_features(backbone, ImageFiles(paths, name=getattr(dataset, "name", "spair")), [request], cache,
                             view, batch_size, device, dtype, distributed=distributed, log=log,
                             strict=strict, resume=resume, checkpoint_seconds=checkpoint_seconds)[request]
    if len(entry) != len(paths):
        raise VitscopeValueError(f"{len(paths) - len(entry)} SPair images could not be read")
    grid = tuple(entry.meta["grid"])
    row = {p: i for i, p in enumerate(paths)}

    def grid_tokens(arr: np.ndarray) -> Callable[[str], torch.Tensor]:
        return lambda path: torch.as_tensor(np.array(arr[row[path]], dtype=np.float32)).T.reshape(-1, *grid)

    block_list = request.block_list(spec.num_blocks)
    scores: dict[str, list[float]] = {f"PCK@{a:g}": [] for a in alphas}
    for b in block_list:
        for k, v in _pck(pairs, grid_tokens(entry.block(b)), canvas, alphas).items():
            scores[k].append(v)
    random = None
    if random_kind is not None:
        noise = random_features(entry.block(block_list[0]).shape, torch.Generator().manual_seed(seed), random_kind)
        random = _pck(pairs, grid_tokens(noise.numpy()), canvas, alphas)
    return probe_result("keypoints", "keypoints", block_list, scores, random, model=spec.name, normaliser=normaliser,
                        num_pairs=len(pairs), pairs_per_category=pairs_per_category, seed=seed,
                        view=view.describe(spec), random_kind=random_kind)
