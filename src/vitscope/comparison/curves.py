"""Per-block quantities of several models on shared axes, and the best-block table (paper 002's comparison).

Every model has been run once over the same data (:func:`vitscope.comparison.run.compare_analyses`); this
module reads its results: attention distance and saliency IoU from the attention analyses (transformers
only: CNNs simply have no such curve), the share of high-norm outliers from the artifacts analysis, clustering
purity and k-NN accuracy from the pooled features (CLS when the model has one, else the spatial mean;
docs/methods.md sections 2 and 3), and full-batch linear CKA between models (unbiased by default) from the
spatial-mean features of the block outputs. Blocks are placed at their relative depth ``b / (L - 1)`` so models
of different depth share the x axis; CKA between models pairs each block with the reference model's block nearest
in relative depth.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from vitscope.analyses.data_checks import DataFacts, class_problem, split_problem
from vitscope.analyses.probes.base import holdout_mask
from vitscope.analyses.probes.clustering import clustering_scores
from vitscope.analyses.probes.knn import knn_scores
from vitscope.errors import VitscopeValueError
from vitscope.functional.cka import linear_cka

__all__ = ["CKA_ESTIMATORS", "QUANTITIES", "Comparison", "Curve", "ModelRun", "compare_runs", "relative_depth"]

#: estimators of the CKA between models: full-batch unbiased HSIC (the default: about 0 for unrelated features
#: whatever the number of images and the widths) or full-batch biased HSIC (unrelated features score well above 0
#: with few images or wide features)
CKA_ESTIMATORS: tuple[str, ...] = ("full_unbiased", "full")
#: what the CKA between models compares, as results.json records it
CKA_FEATURES = ("mean of the spatial tokens of every block output (blocks.*.resid_post, prefix tokens left out; "
                "a CNN: of every stages.* map), over the images both models read")

#: quantity -> (axis label, higher is better: part of the best-block table)
QUANTITIES: dict[str, tuple[str, bool]] = {
    "attention_distance": ("mean attention distance (unit square)", False),
    "saliency_iou": ("best-head saliency IoU", True),
    "clustering_purity": ("clustering purity", True),
    "knn_accuracy": ("k-NN accuracy", True),
    "cka_to_reference": ("CKA with the reference model", False),
    "outlier_fraction": ("share of patch tokens that are high-norm outliers", False),
}


@dataclass
class ModelRun:
    """One model's pass: its id, spec, Results (by analysis name) and display name (default: the id)."""

    model_id: str
    spec: Any
    results: Mapping[str, Any]
    name: str = ""

    @property
    def label(self) -> str:
        """What the model is called in legends, tables and the report."""
        return self.name or self.model_id


@dataclass
class Curve:
    """Values per block; ``x`` is the relative depth of each block."""

    blocks: list[int]
    x: list[float]
    values: list[float]


@dataclass
class Comparison:
    """Everything ``vitscope compare`` plots and tabulates.

    Attributes:
        curves: ``{quantity: {model: Curve}}`` (a model without a quantity is absent from it).
        random: ``{quantity: {model: random-baseline value}}`` where one exists. Each model has its own: random
            attention depends on the token grid (a p16 and a p8 model have different random distances and IoUs).
        cka_models: model order of ``cka_matrix``; cka_matrix: ``[M, M]`` CKA of the final blocks.
        reference: the model the ``cka_to_reference`` curves compare with.
        cka: how the CKA between models was computed: ``estimator`` (:data:`CKA_ESTIMATORS`) and ``features``.
        best_blocks: rows of the best-block table.
        notes: why a quantity is missing (no labels, no masks...).
        probe_settings: how the clustering and k-NN curves were made (empty when none was): ``seed``,
            ``test_fraction``, ``knn`` (``k``, ``temperature``) and per model its ``pooling`` (``"cls"`` or
            ``"mean"``), ``clusters`` (k-means k), ``num_train`` and ``num_test``.
    """

    curves: dict[str, dict[str, Curve]] = field(default_factory=dict)
    random: dict[str, dict[str, float]] = field(default_factory=dict)
    cka_models: list[str] = field(default_factory=list)
    cka_matrix: torch.Tensor | None = None
    reference: str = ""
    cka: dict[str, str] = field(default_factory=dict)
    best_blocks: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    probe_settings: dict[str, Any] = field(default_factory=dict)


def relative_depth(blocks: Sequence[int]) -> list[float]:
    """``b / (L - 1)`` of every block (0 for a single block)."""
    n = len(blocks)
    return [i / (n - 1) if n > 1 else 0.0 for i in range(n)]


def _curve(blocks: Sequence[int], values: Sequence[float]) -> Curve:
    return Curve([int(b) for b in blocks], relative_depth(blocks), [float(v) for v in values])


def _mean(x: torch.Tensor | float) -> float:
    return float(torch.as_tensor(x, dtype=torch.float64).nanmean())


def _attention_curves(run: ModelRun, comp: Comparison) -> None:
    dist = run.results.get("attention_distance")
    if dist is not None and "block_mean" in dist.tensors:
        blocks = dist.meta.get("blocks") or list(range(len(dist.tensors["block_mean"])))
        comp.curves.setdefault("attention_distance", {})[run.label] = _curve(blocks, dist.tensors["block_mean"])
        comp.random.setdefault("attention_distance", {})[run.label] = _mean(dist.tensors["random_block_mean"])
    sal = run.results.get("saliency_iou")
    if sal is not None:
        source = "cls" if "cls_best_iou" in sal.tensors else "spatial"
        if f"{source}_best_iou" in sal.tensors:
            blocks = sal.meta.get("blocks") or list(range(len(sal.tensors[f"{source}_best_iou"])))
            comp.curves.setdefault("saliency_iou", {})[run.label] = _curve(blocks, sal.tensors[f"{source}_best_iou"])
            comp.random.setdefault("saliency_iou", {})[run.label] = _mean(sal.tensors[f"random_{source}_best_iou"])


def _artifact_curves(run: ModelRun, comp: Comparison) -> None:
    """The share of high-norm outliers after every block (with ``--analyses artifacts``): how much registers, or
    their absence, change them."""
    art = run.results.get("artifacts")
    if art is not None and "outlier_fraction" in art.tensors:
        blocks = art.meta.get("blocks") or list(range(len(art.tensors["outlier_fraction"]) - 1))
        comp.curves.setdefault("outlier_fraction", {})[run.label] = _curve(blocks, art.tensors["outlier_fraction"][1:])


def _image_pooling(run: ModelRun) -> str:
    """The token an image's features are read from: ``"cls"`` where the model has one, else ``"mean"``."""
    return "cls" if run.results["pooled_features"].meta.get("has_cls") else "mean"


def _features(run: ModelRun, kind: str) -> tuple[list[int], dict[int, np.ndarray], np.ndarray, np.ndarray] | None:
    pooled = run.results.get("pooled_features")
    if pooled is None or "index" not in pooled.tensors:
        return None
    blocks = list(pooled.meta["blocks"])
    prefix = _image_pooling(run) if kind == "image" else "mean"
    feats = {b: pooled.tensors[f"{prefix}_{b}"].numpy() for b in blocks}
    return blocks, feats, pooled.tensors["index"].numpy(), pooled.tensors["label"].numpy()


def _note(comp: Comparison, note: str) -> None:
    if note not in comp.notes:
        comp.notes.append(note)


def _note_settings(comp: Comparison, run: ModelRun, seed: int, test_fraction: float, clus: Any,
                   knn: Any = None) -> None:
    """Record how a model's clustering (and k-NN) curves were made: the settings they ran with, as their results
    hold them, and the token its image features were pooled from."""
    settings = comp.probe_settings
    settings.update(seed=seed, test_fraction=test_fraction)
    model = settings.setdefault("models", {}).setdefault(run.label, {})
    model.update(pooling=_image_pooling(run), clusters=clus.meta["k"])
    if knn is not None:
        settings["knn"] = {"k": knn.meta["k"], "temperature": knn.meta["temperature"]}
        model.update(num_train=knn.meta["num_train"], num_test=knn.meta["num_test"])


def _probe_curves(run: ModelRun, comp: Comparison, seed: int, test_fraction: float, data: DataFacts) -> None:
    found = _features(run, "image")
    if found is None:
        return
    blocks, feats, index, labels = found
    problem = class_problem(labels, data.name, data.class_names, data.hint)  # the words analyze and probe use
    if problem:
        _note(comp, problem)
        return
    keep = labels >= 0
    y = labels[keep]
    clus = clustering_scores(blocks, lambda b: feats[b][keep], y, seed=seed)
    _note_settings(comp, run, seed, test_fraction, clus)
    comp.curves.setdefault("clustering_purity", {})[run.label] = _curve(blocks, clus.tensors["purity"])
    comp.random.setdefault("clustering_purity", {})[run.label] = float(clus.tensors["random_purity"])
    test = holdout_mask(index[keep], test_fraction, seed)
    problem = split_problem(test, test_fraction)
    if problem:
        _note(comp, problem)
        return
    knn = knn_scores(blocks, lambda b: (feats[b][keep][~test], feats[b][keep][test]), y[~test], y[test], seed=seed)
    comp.curves.setdefault("knn_accuracy", {})[run.label] = _curve(blocks, knn.tensors["accuracy"])
    comp.random.setdefault("knn_accuracy", {})[run.label] = float(knn.tensors["random_accuracy"])
    _note_settings(comp, run, seed, test_fraction, clus, knn)


def _aligned(a: tuple, b: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Row positions of the images both feature sets hold (same order)."""
    common = np.intersect1d(a[2], b[2])
    return np.searchsorted(a[2], common), np.searchsorted(b[2], common)


def _cka(x: np.ndarray, y: np.ndarray, unbiased: bool) -> float:
    """Full-batch linear CKA of two models' rows ``[n, D]``; NaN under 4 images (unbiased) or 2 (biased)."""
    if len(x) < (4 if unbiased else 2):
        return math.nan
    return linear_cka(torch.from_numpy(x).double(), torch.from_numpy(y).double(), unbiased=unbiased)


def _cka_between_models(runs: Sequence[ModelRun], comp: Comparison, estimator: str) -> None:
    feats = {r.label: _features(r, "spatial") for r in runs}
    feats = {k: v for k, v in feats.items() if v is not None}
    if len(feats) < 2:
        return
    names, unbiased = list(feats), estimator == "full_unbiased"
    comp.cka = {"estimator": estimator, "features": CKA_FEATURES}
    comp.reference, ref = names[0], feats[names[0]]
    ref_depth = np.asarray(relative_depth(ref[0]))
    for name in names:
        blocks, fm = feats[name][0], feats[name][1]
        ra, rb = _aligned(feats[name], ref)
        values = [_cka(fm[b][ra], ref[1][ref[0][int(np.abs(ref_depth - d).argmin())]][rb], unbiased)
                  for b, d in zip(blocks, relative_depth(blocks))]
        comp.curves.setdefault("cka_to_reference", {})[name] = _curve(blocks, values)
    matrix = torch.full((len(names), len(names)), math.nan, dtype=torch.float64)
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            ra, rb = _aligned(feats[a], feats[b])
            fa, fb = feats[a], feats[b]
            matrix[i, j] = _cka(fa[1][fa[0][-1]][ra], fb[1][fb[0][-1]][rb], unbiased)
    comp.cka_models, comp.cka_matrix = names, matrix
    need = 4 if unbiased else 2
    shared = min(len(_aligned(feats[a], feats[b])[0]) for a in names for b in names)
    if shared < need:  # every value is blank, the diagonal too: say why beside them
        comp.notes.append(f"CKA between models is blank: the models share {shared} image(s) and the {estimator} "
                          f"estimator needs at least {need}")


def _best_blocks(comp: Comparison) -> list[dict[str, Any]]:
    rows = []
    for quantity, (_, ranked) in QUANTITIES.items():
        if not ranked:
            continue
        for model, curve in comp.curves.get(quantity, {}).items():
            values = np.asarray(curve.values, dtype=np.float64)
            if np.isnan(values).all():
                continue
            pos = int(np.nanargmax(values))
            rows.append({"model": model, "quantity": quantity, "best_block": curve.blocks[pos],
                         "relative_depth": round(curve.x[pos], 3), "best": float(values[pos]),
                         "last_block": float(values[-1]),
                         "random": comp.random.get(quantity, {}).get(model, math.nan)})
    return rows


def compare_runs(runs: Sequence[ModelRun], seed: int = 0, test_fraction: float = 0.2,
                 data: DataFacts | None = None, cka_estimator: str = "full_unbiased") -> Comparison:
    """Curves, CKA between models and the best-block table of several models' passes.

    Args:
        runs: one :class:`ModelRun` per model, in display order (the first is the CKA reference).
        seed: k-means / k-NN split / random-baseline seed.
        test_fraction: share of images held out for k-NN (by a seeded hash of the dataset index).
        data: the data the models saw (names it, and its classes, in the note saying why clustering and k-NN
            are left out: no labels, one class...).
        cka_estimator: ``"full_unbiased"`` (default) or ``"full"`` (biased) full-batch linear CKA between models
            (:data:`CKA_ESTIMATORS`).
    """
    if cka_estimator not in CKA_ESTIMATORS:
        raise VitscopeValueError(f"cka_estimator must be one of {', '.join(CKA_ESTIMATORS)}, got {cka_estimator!r}")
    comp = Comparison()
    data = data if data is not None else DataFacts()
    for run in runs:
        _attention_curves(run, comp)
        _artifact_curves(run, comp)
        _probe_curves(run, comp, seed, test_fraction, data)
    _cka_between_models(runs, comp, cka_estimator)
    comp.best_blocks = _best_blocks(comp)
    return comp
