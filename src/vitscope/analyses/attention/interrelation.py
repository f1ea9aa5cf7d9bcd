"""SIFT patch interrelation per block and head, the focus index and the three stages (paper 003 sections 2-4).

For every image the SIFT keypoints of the preprocessed image (model resolution) are counted per patch
(:func:`~vitscope.functional.sift_keypoint_counts`), by the engine's loader beside decoding; every block's
pattern gives KK, KN, NK and NN per head on the pattern's device (:func:`~vitscope.functional.interrelation`;
docs/methods.md, SIFT patch interrelation), and what depends on the counts alone (the random baseline, the
totals) is host work. The attention focus index comes from the shared per-block pass, so ``--analyses
attention,interrelation`` reduces each pattern once for both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import torch

from vitscope.analyses.attention.base import PATTERN_HOOKS, AttentionAccumulator, AttentionGeometry, thumbnails
from vitscope.analyses.base import Batch, Figure, Result
from vitscope.analyses.batch import ATTENTION_BLOCKS, SIFT_KEYPOINTS, recorded_patterns
from vitscope.analyses.registry import register_analysis
from vitscope.analyses.state import added, first_seen
from vitscope.errors import VitscopeValueError
from vitscope.functional.attention_blocks import BlockStats
from vitscope.functional.interrelation import check_detection, interrelation, random_interrelation
from vitscope.functional.interrelation_stages import BAND, interrelation_stages, outside_baseline
from vitscope.models.spec import ModelSpec
from vitscope.strict_json import NULL_REASONS, note_null

__all__ = ["Interrelation", "InterrelationResult", "batch_keypoint_counts", "stage_verdict"]

QUANTITIES: tuple[str, ...] = ("KK", "KN", "NK", "NN")


def batch_keypoint_counts(batch: Batch, record: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
    """SIFT keypoints per patch of every image of the batch at model resolution: ``[B, h, w]`` int64 (CPU).

    The batch's shared quantity ``"sift_keypoints"``: counted by the loader (host data), or once per batch for
    every analysis that reads it.
    """
    return batch.quantity(SIFT_KEYPOINTS, record or {})


def stage_verdict(kk: torch.Tensor, baseline: float, spread: float, images: int, band: float,
                  outside: list[int]) -> str:
    """The stage rule's verdict as one sentence with its numbers (results.json, the report).

    Args:
        kk: ``[L]`` KK per block (mean over heads).
        baseline, spread: the random baseline's KK (mean over images) and its standard deviation over images.
        images: images behind the baseline.
        band: half-width of the band in standard deviations.
        outside: block numbers whose KK lies outside the band.
    """
    finite = kk[~kk.isnan()]
    runs = f"{float(finite.min()):.4f}-{float(finite.max()):.4f}" if finite.numel() else "undefined"
    if images < 2:
        return (f"no stage structure: the random baseline's spread needs at least 2 images with keypoint patches "
                f"({images} here); KK (mean over heads) runs {runs} over blocks")
    where = (f"the random baseline {baseline:.4f} ± {band * spread:.4f} ({band:g} std over {images} images, "
             "random attention on the same keypoints)")
    if not outside:
        return f"no stage structure: KK (mean over heads) runs {runs} over blocks, within {where} at every block"
    return (f"stages read from KK (mean over heads, {runs} over blocks): block(s) "
            f"{', '.join(str(b) for b in outside)} lie outside {where}")


class InterrelationResult(Result):
    """Result of :class:`Interrelation`: paper 003's figures 3, 5, 6 and 7a."""

    DIMS = {"*_blocks": ("block",), "*_blocks_std": ("block",), "images": ("image", "y", "x", "channel"),
            "keypoint_counts": ("image", "row", "column"), "*": ("block", "head")}

    def figures(self) -> list[Figure]:
        """``<name>_keypoints`` (fig. 3), ``<name>_kk_nk`` (fig. 5), ``<name>_focus`` (fig. 6) and
        ``<name>_stages`` (fig. 7a)."""
        if "KK" not in self.tensors:
            return []
        labels = self.meta.get("blocks")

        def keypoints(path: Path) -> list[Path]:
            from vitscope.viz.interrelation_figures import keypoint_grid_figure

            return keypoint_grid_figure(self.tensors["images"], self.tensors["keypoint_counts"], path)

        def kk_nk(path: Path) -> list[Path]:
            from vitscope.viz.interrelation_figures import kk_nk_figure

            return kk_nk_figure(self.tensors, path, labels, self.meta)

        def focus(path: Path) -> list[Path]:
            from vitscope.viz.interrelation_figures import focus_figure

            return focus_figure(self.tensors["focus"], path, labels)

        def stages(path: Path) -> list[Path]:
            from vitscope.viz.interrelation_figures import stages_figure

            return stages_figure(self.tensors, self.meta.get("stages", {}), path, labels,
                                 self.meta.get("stage_structure", ""))

        figures = [self.figure("_keypoints", keypoints, "SIFT keypoints on sample images with the patch grid; "
                               "keypoint patches marked.", "paper 003, fig. 3")] if "images" in self.tensors else []
        from vitscope.viz.charts import block_lines_chart, curve

        kk, nk, fo = (self.tensors[k].double() for k in ("KK", "NK", "focus"))
        n = kk.shape[0]
        interrelation = block_lines_chart(
            [curve("KK", kk.nanmean(dim=1), "KK"), curve("KK", kk, "KK", "dots"),
             curve("NK", nk.nanmean(dim=1), "NK"), curve("NK", nk, "NK", "dots"), *self._baseline_curves()],
            "weighted interrelation", n, labels, "Interrelation from keypoint (KK) and non-keypoint (NK) patches "
            "(dots: heads; dashed: random attention)", (0.0, 1.0))
        verdict = self.meta.get("stage_structure", "")
        focus_chart = block_lines_chart([curve("mean over heads", fo.mean(dim=1), "mean over heads"),
                                         curve("heads", fo, "", "dots")], "focus index (nats)", n, labels,
                                        "Attention focus index per head (lower = more focused)")
        return figures + [
            self.figure("_kk_nk", kk_nk, "Weighted interrelation KK and NK per block (mean over heads and images; "
                        "dots: single heads), with the random baseline (dashed: random attention on the same "
                        "keypoints; dotted: its band, mean ± "
                        f"{self.meta.get('band', BAND):g} std over images).", "paper 003, fig. 5 and 6",
                        chart=interrelation),
            self.figure("_focus", focus, "Attention focus index per block and head.", "paper 003, fig. 7a",
                        chart=focus_chart),
            self.figure("_stages", stages, "Retrieval, capture and coach stages found from the interrelation "
                        "curves (shaded): KK, KN, NK and NN per block (mean over heads) with the focus index over its "
                        "maximum log K (dashed)." + (f" {verdict[:1].upper()}{verdict[1:]}." if verdict else ""),
                        "paper 003, fig. 7a", chart=self._stages_chart(labels)),
        ]

    def _baseline_curves(self) -> list:
        """The random baseline of KK and NK (dashed) and the band of KK that the stage rule reads (dotted)."""
        from vitscope.viz.charts import curve

        if "random_KK_blocks" not in self.tensors:
            return []
        t, band = self.tensors, float(self.meta.get("band", BAND))
        base, spread = t["random_KK_blocks"].double(), band * t["random_KK_blocks_std"].double()
        edge = f"random KK ± {band:g} std (baseline band)"
        return [curve("random attention KK (baseline)", base, "KK", "dashed"),
                curve(edge, base - spread, "KK", "dotted", baseline=True),
                curve(edge, base + spread, "KK", "dotted", baseline=True),
                curve("random attention NK (baseline)", t["random_NK_blocks"].double(), "NK", "dashed")]

    def _stages_chart(self, labels: list | None):
        """KK, KN, NK, NN and focus / log K per block on one axis (all in [0, 1]), the stages as bands."""
        from vitscope.viz.charts import Band, block_lines_chart, curve, tick_names

        n = self.tensors["KK"].shape[0]
        ticks = tick_names(n, labels)
        position = {t: i for i, t in enumerate(ticks)}
        bands = []
        for stage, blocks in self.meta.get("stages", {}).items():
            idx = sorted(position[str(b)] for b in blocks if str(b) in position)
            if idx:
                bands.append(Band(stage, ticks[idx[0]], ticks[idx[-1]]))
        lines = [curve(k, self.tensors[k].double().nanmean(dim=1), k) for k in ("KK", "KN", "NK", "NN")]
        lines += self._baseline_curves()[:1]  # the KK baseline the stages are read against
        lines.append(curve("focus / log K", self.tensors["focus_normalised"].double().nanmean(dim=1), "", "dashed",
                           baseline=False))
        return block_lines_chart(lines, "weighted interrelation; focus / log K", n, labels,
                                 "Stages of attention (paper 003)" + (
                                     ": no stage structure" if self.meta.get("has_stages") is False else ""),
                                 (0.0, 1.0), bands)


@register_analysis("interrelation", order=160)
class Interrelation(AttentionAccumulator):
    """Weighted SIFT patch interrelation KK/KN/NK/NN per block and head, plus the focus index and stages.

    Args:
        lam: detection-line height (docs/methods.md, SIFT patch interrelation).
        rule: ``"max"`` (``a > lam * max``, default) or ``"uniform"`` (``a > lam / K``).
        rise: stage rule parameter (:func:`~vitscope.functional.interrelation_stages`).
        band: half-width, in standard deviations over images, of the random baseline's band (default 0.5, a
            medium effect): stages are read only when KK (mean over heads) leaves the band at some block, else
            "no stage structure".
        images: dataset indices whose image and keypoint counts are kept for figure 3.
        seed, random_samples, random_kind: the random baseline: ``random_samples`` random heads of
            ``random_kind`` values (uniform or half-normal) drawn once from ``seed``
            (:func:`~vitscope.functional.random_interrelation`).

    State: ``num_images``, ``geometry``; ``sums`` and ``counts``: quantity (``KK``, ``NK``) -> ``[L, H]``
    float64 sum over images where it is defined and number of such images; ``focus_sum`` ``[L, H]``;
    ``keypoints`` (total keypoints), ``keypoint_patches`` (total keypoint patches); ``random_sums``: quantity
    -> ``[3]`` float64 (sum, sum of squares, number of images) of each image's KK / NK under random attention;
    chosen images.

    Result tensors: ``KK``, ``KN``, ``NK``, ``NN``, ``focus``, ``focus_normalised`` ``[L, H]``; the means over
    heads ``KK_blocks`` ... ``NN_blocks``, ``focus_blocks`` ``[L]``; the random baseline ``random_KK_blocks``
    and ``random_NK_blocks`` ``[L]`` (mean over images; the same at every block) with ``random_KK_blocks_std``
    and ``random_NK_blocks_std`` (standard deviation over images); ``images`` ``[I, H, W, 3]`` and
    ``keypoint_counts`` ``[I, h, w]`` of the chosen images. meta: geometry, ``stages`` (block numbers of
    retrieval / capture / coach, all empty without stage structure), ``has_stages``, ``stage_structure`` (the
    rule's verdict with its numbers), ``baseline_images``, ``lam``, ``rule``, ``band``, ``mean_keypoints``,
    ``keypoint_patch_fraction``, ``images_with_keypoints``.
    """

    description = ("SIFT patch interrelation: how much of each head's attention from keypoint (K) and non-keypoint "
                   "(N) patches goes to keypoint patches (KK, NK), the focus index, and the retrieval / capture / "
                   "coach stages read from those curves.")
    summary = "SIFT keypoint interrelation per block and head"

    NEEDS = frozenset({"focus"})

    def __init__(self, lam: float = 0.5, rule: str = "max", rise: float = 0.5, band: float = BAND,
                 images: tuple[int, ...] = (0, 1, 2, 3), seed: int = 0, random_samples: int = 4,
                 random_kind: str = "uniform") -> None:
        check_detection(lam, rule)
        if not 0 <= rise <= 1:
            raise VitscopeValueError(f"rise must be a fraction in [0, 1], got {rise}")
        if not band >= 0:
            raise VitscopeValueError(f"band must be a non-negative number of standard deviations, got {band}")
        self._cfg_lam, self._cfg_rule, self._cfg_rise, self._cfg_band = float(lam), rule, float(rise), float(band)
        self._cfg_images = frozenset(int(i) for i in images)
        super().__init__(seed=seed, random_samples=random_samples, random_kind=random_kind)

    def _declare_sums(self) -> None:
        self.add_state("sums", {}, reduce="sum")  # "KK" / "NK" -> [L, H]
        self.add_state("counts", {}, reduce="sum")
        self.add_state("focus_sum", None, reduce="sum")
        self.add_state("focus_normalised_sum", None, reduce="sum")  # each image's over the log of its patches
        self.add_state("patches", 0, reduce="sum")  # spatial tokens of every image
        # counted from the host's keypoint counts as CPU tensors: reading them as numbers would be a host read
        self.add_state("keypoints", torch.zeros((), dtype=torch.int64), reduce="sum")
        self.add_state("keypoint_patches", torch.zeros((), dtype=torch.int64), reduce="sum")
        self.add_state("images_with_keypoints", torch.zeros((), dtype=torch.int64), reduce="sum")
        self.add_state("random_sums", {}, reduce="sum")  # "KK" / "NK" -> [3]: sum, sum of squares, images
        self.add_state("chosen", {}, reduce=first_seen)  # index -> (thumbnail, keypoint counts)

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        """Add one batch: reads every ``blocks.{i}.attn.pattern`` ``[B, H, N, N]`` and the batch's keypoint counts
        (``[B, h, w]`` on the host)."""
        geometry, pairs = self._patterns(record, batch)
        if pairs[0][1].shape[0] == 0:
            return
        self._adopt(geometry, batch.grid, pairs[0][1].shape[0])
        self.model = self.model or batch.spec.name
        blocks = batch.quantity(ATTENTION_BLOCKS, record, self.NEEDS)
        stats = [blocks[i] for i, _ in pairs]
        counts = batch_keypoint_counts(batch, record)
        scratch = self.per_batch(batch)
        if "KK" not in scratch:  # not fed by the engine: read the record's patterns now
            for _, key in recorded_patterns(record):
                self.update_hook(key, record[key], batch)
        for q in ("KK", "NK"):  # [L, H] on the batch's device
            self.sums[q] = added(self.sums.get(q), torch.stack([s for s, _ in scratch[q]]))
            self.counts[q] = added(self.counts.get(q), torch.stack([c for _, c in scratch[q]]))
        self._update_blocks(geometry, stats, batch)
        self._update_baseline(counts, geometry, batch.grid)
        self._update_keypoints(counts)
        for j, idx in enumerate(batch.indices):
            if int(idx) in self._cfg_images and int(idx) not in self.chosen:
                self.chosen[int(idx)] = (thumbnails(batch, [j])[0], counts[j].clone())

    def _update_keypoints(self, counts: torch.Tensor) -> None:
        """Add the batch's keypoints, keypoint patches and images with a keypoint (``counts``: ``[B, h, w]``
        int64 on the host, summed as tensors)."""
        self.keypoints = self.keypoints + counts.sum()
        self.keypoint_patches = self.keypoint_patches + (counts > 0).sum()
        self.images_with_keypoints = self.images_with_keypoints + (counts.flatten(1) > 0).any(dim=1).sum()

    def _update_baseline(self, counts: torch.Tensor, geometry: AttentionGeometry, grid: tuple[int, int]) -> None:
        """Add every image's KK and NK under random attention (mean over the random heads)."""
        rand = random_interrelation(counts, tuple(grid), geometry.num_prefix, self._cfg_lam, self._cfg_rule,
                                    self._cfg_seed, self._cfg_random_samples, self._cfg_random_kind)
        for q in ("KK", "NK"):  # [B]: each image's value, NaN where undefined (left out of the sums)
            v = rand[q].nanmean(dim=1)
            add = torch.stack([v.nansum(), (v * v).nansum(), (~v.isnan()).sum().to(torch.float64)])
            self.random_sums[q] = add if q not in self.random_sums else self.random_sums[q] + add

    def _baseline(self, q: str) -> tuple[float, float, int]:
        """Mean and standard deviation over images (NaN below two images) of ``q`` under random attention."""
        total, squares, n = (float(v) for v in self.random_sums.get(q, torch.zeros(3, dtype=torch.float64)))
        mean = total / n if n else float("nan")
        std = math.sqrt(max(squares - total * mean, 0.0) / (n - 1)) if n > 1 else float("nan")
        return mean, std, int(n)

    def stream_hooks(self, spec: ModelSpec) -> list[str]:
        return [PATTERN_HOOKS]

    def update_hook(self, name: str, pattern: torch.Tensor, batch: Batch) -> None:
        """KK and NK ``[H]`` of one block, summed over the batch's images, with the number of images where each
        is defined: kept on the pattern's device."""
        scratch = self.per_batch(batch)
        if "device_counts" not in scratch:  # the host's counts, copied once per batch without waiting
            scratch["device_counts"] = batch_keypoint_counts(batch).to(pattern.device, non_blocking=True)
        d = interrelation(pattern, scratch["device_counts"], batch.grid, int(batch.spec.num_prefix_tokens),
                          self._cfg_lam, self._cfg_rule)
        for q in ("KK", "NK"):
            ok = ~d[q].isnan()
            scratch.setdefault(q, []).append((torch.where(ok, d[q], torch.zeros_like(d[q])).sum(dim=0),
                                              ok.sum(dim=0).to(torch.float64)))

    def shared_quantities(self, spec: ModelSpec) -> dict[str, frozenset[str]]:
        return {**super().shared_quantities(spec), SIFT_KEYPOINTS: frozenset()}

    def _update_blocks(self, geometry: AttentionGeometry, stats: list[BlockStats], batch: Batch) -> None:
        """Add the focus index ``[L, H]`` summed over the batch's images (on its device) and count the images."""
        focus = torch.stack([s.focus.sum(dim=0) for s in stats]).to(torch.float64)
        self.focus_sum = added(self.focus_sum, focus)
        k = int(batch.grid[0]) * int(batch.grid[1])
        normalised = focus / math.log(k) if k > 1 else torch.zeros_like(focus)
        self.focus_normalised_sum = added(self.focus_normalised_sum, normalised)
        self.patches += k * stats[0].batch_size
        self.num_images += stats[0].batch_size

    def compute(self) -> InterrelationResult:
        meta = self._base_meta()
        meta.update({"lam": self._cfg_lam, "rule": self._cfg_rule, "rise": self._cfg_rise, "band": self._cfg_band})
        if self.num_images == 0:
            return InterrelationResult(name=self.name, tensors={}, meta=meta)
        g = self.geometry
        nan = float("nan")
        tensors: dict[str, torch.Tensor] = {}
        for q, twin in (("KK", "KN"), ("NK", "NN")):
            c = self.counts[q]
            mean = torch.where(c > 0, self.sums[q] / c.clamp(min=1), torch.full_like(c, nan))
            tensors[q], tensors[twin] = mean, 1 - mean
        focus = self.focus_sum / self.num_images
        tensors["focus"] = focus
        (main, _), *others = self.grid_counts()
        k = main[0] * main[1]
        if others:  # images of several grids: each normalised by its own patches
            tensors["focus_normalised"] = self.focus_normalised_sum / self.num_images
        else:
            log_k = torch.log(torch.tensor(float(k), dtype=torch.float64))
            tensors["focus_normalised"] = focus / log_k if k > 1 else torch.zeros_like(focus)
        for q in (*QUANTITIES, "focus"):
            tensors[f"{q}_blocks"] = tensors[q].nanmean(dim=-1)
        for q in QUANTITIES:  # an image's KK (NK) is defined when it has a (non-)keypoint patch
            if tensors[q].isnan().any():
                note_null(meta, q, f"no image had a {'keypoint' if q in ('KK', 'KN') else 'non-keypoint'} patch")
            if tensors[f"{q}_blocks"].isnan().any():
                note_null(meta, f"{q}_blocks", meta[NULL_REASONS][q])
        if self.chosen:  # the chosen images of the main grid (those of other grids are not one tensor)
            order = [i for i in sorted(self.chosen) if tuple(self.chosen[i][1].shape) == tuple(main)]
            if order:
                tensors["images"] = torch.stack([self.chosen[i][0] for i in order])
                tensors["keypoint_counts"] = torch.stack([self.chosen[i][1] for i in order])
                meta["image_indices"] = order
        counts = {}
        for q in ("KK", "NK"):
            mean, std, counts[q] = self._baseline(q)
            tensors[f"random_{q}_blocks"] = torch.full((len(g.blocks),), mean, dtype=torch.float64)
            tensors[f"random_{q}_blocks_std"] = torch.full((len(g.blocks),), std, dtype=torch.float64)
        kk, base, spread = tensors["KK_blocks"], tensors["random_KK_blocks"], tensors["random_KK_blocks_std"]
        stages = interrelation_stages(kk, self._cfg_rise, base, spread, self._cfg_band)
        outside = [g.blocks[int(i)] for i in outside_baseline(kk, base, spread, self._cfg_band).nonzero().flatten()]
        meta["stages"] = {k: [g.blocks[i] for i in v] for k, v in stages.items()}
        meta["has_stages"] = bool(outside)
        meta["stage_structure"] = stage_verdict(kk, float(base[0]), float(spread[0]), counts["KK"], self._cfg_band,
                                                outside)
        meta["baseline_images"] = counts
        meta["stage_focus"] = {k: (float(tensors["focus_normalised"].mean(-1)[v].mean()) if v else nan)
                               for k, v in stages.items()}
        for k, v in stages.items():
            if not v:
                note_null(meta, f"stage_focus.{k}", "no block is in this stage")
        meta["mean_keypoints"] = int(self.keypoints) / self.num_images
        meta["keypoint_patch_fraction"] = int(self.keypoint_patches) / self.patches
        meta["images_with_keypoints"] = int(self.images_with_keypoints)
        return InterrelationResult(name=self.name, tensors=tensors, meta=meta)
