"""What the artifacts analysis reports: thresholds chosen from its norm histograms, the outliers' counts, places and
surroundings, the sink heads, the massive activations and the register neurons, with their figures."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from vitscope.analyses.base import Figure, Result
from vitscope.analyses.grids import by_images, grid_of
from vitscope.functional.artifacts import split_threshold
from vitscope.models.spec import starts_with_cls

__all__ = ["ArtifactsResult", "summarise"]

PAPERS = ("Darcet et al. 2024, Vision Transformers Need Registers; Sun et al. 2024, Massive Activations in Large "
          "Language Models; Jiang et al. 2025, Vision Transformers Don't Need Trained Registers")


#: the sink score of each criterion (:func:`_sink_criterion`): ``[L, H]`` result tensors
_SINK_SCORES = {"cls_share": "sink_cls_outliers", "all_share": "sink_all_outliers"}
#: the sink heat map's title, unit and caption under each criterion
_SINK_FIGURES = {
    "cls_share": ("CLS attention to the outlier tokens", "share of the CLS row",
                  "Share of the CLS query's attention that goes to the outlier tokens of each block's input, per head "
                  "(sink heads are bright)."),
    "all_share": ("Attention the outlier tokens receive", "mean share over the queries",
                  "Share of the attention that goes to the outlier tokens of each block's input, averaged over all "
                  "queries, per head (the model has no CLS token; sink heads are bright)."),
}


class ArtifactsResult(Result):
    """Result of :class:`~vitscope.analyses.diagnostics.artifacts.Artifacts`."""

    DIMS = {"norm_histogram": ("row", "bin"), "norm_edges": ("edge",), "outlier_positions": ("row", "y", "x"),
            "prefix_norm": ("row", "prefix"), "sink_*_prefix": ("block", "head", "prefix"),
            "sink_*": ("block", "head"), "massive_top3": ("block", "rank"), "massive_*_by_dim": ("block", "channel"),
            "massive_count_by_token": ("block", "token"), "massive_*": ("block",),
            "neuron_*": ("block", "unit"), "norm_maps": ("image", "row", "y", "x"),
            "norm_map_indices": ("image",), "pictures": ("image", "y", "x", "rgb"), "*": ("row",)}

    def figures(self) -> list[Figure]:
        """Norm histograms per row, outlier maps over the kept images, CLS attention to the outliers per block and
        head, and the register-neuron ranking."""
        t, m = self.tensors, self.meta
        if "norm_histogram" not in t:
            return []
        rows = m.get("rows", [])
        out = [self.figure("_norms", lambda path: _histograms(t, rows, path),
                           "Token-norm histograms of the patch tokens, one row per block output (norm on a log scale, "
                           "colour the log count); the red bar is the row's outlier threshold, where its norms split "
                           "in two modes.",
                           PAPERS)]
        if "norm_maps" in t and len(t["norm_maps"]):
            out.append(self.figure("_maps", lambda path: _maps(t, m, path),
                                   "Patch-token norms over the kept images at the row with the most outliers "
                                   "(bright: high norm); outliers are marked.", PAPERS))
        if "sink_cls_outliers" in t:
            criterion = _sink_criterion(m.get("prefix_kinds", []))
            title, unit, caption = _SINK_FIGURES[criterion]
            out.append(self.heatmap_figure("_sinks", t[_SINK_SCORES[criterion]], title, unit, caption, PAPERS,
                                           block_labels=m.get("blocks"), quantity=criterion))
        if m.get("register_neurons"):
            out.append(self.figure("_neurons", lambda path: _neurons(m, path),
                                   "MLP units ranked by their mean activation on the outlier tokens of their "
                                   "block's output (register neurons, Jiang et al. 2025).", PAPERS))
        return out


def _edge_of(analysis: Any, row: int, hist: torch.Tensor) -> int | None:
    """The threshold edge of one row: the hand-set threshold's, or the automatic split's."""
    threshold = analysis._cfg["threshold"]
    if threshold is not None:
        return int(round((math.log10(threshold) - analysis.bins.low) / analysis.bins.width))
    return split_threshold(hist[row], analysis._cfg["max_share"], analysis._cfg["min_ratio"])


def summarise(analysis: Any) -> ArtifactsResult:
    """The result of a finished artifacts analysis (states on the host)."""
    s, mx, n = analysis.sums, analysis.maxima, analysis.num_images
    blocks = list(analysis.blocks)
    meta: dict[str, Any] = {"model": analysis.model, "num_images": n, "blocks": blocks,
                            "rows": ["embedding", *[f"block {b}" for b in blocks]],
                            "prefix_kinds": list(analysis.prefix_kinds), **analysis._cfg}
    if n == 0 or "hist" not in s:
        return ArtifactsResult(analysis.name, {}, meta)
    hist = s["hist"]
    edges = analysis.bins.edges()
    cuts = [_edge_of(analysis, r, hist) for r in range(hist.shape[0])]
    thresholds = torch.tensor([float("nan") if e is None else float(edges[e]) for e in cuts], dtype=torch.float64)

    def above(values: torch.Tensor, row: int) -> torch.Tensor:  # [..., NB] -> [...] summed over outlier bins
        e = cuts[row]
        return values[..., e:].sum(dim=-1) if e is not None else torch.zeros(values.shape[:-1], dtype=torch.float64)

    counts = torch.stack([above(hist[r], r) for r in range(hist.shape[0])])
    tokens = hist.sum(dim=1)
    t: dict[str, torch.Tensor] = {
        "norm_histogram": hist, "norm_edges": edges, "threshold": thresholds, "outlier_fraction": counts / tokens,
        "norm_mean": s["norm_sum"] / tokens, "norm_max": mx["max_norm"], "prefix_norm": s["prefix_norm"] / n}
    main = by_images((k.split("@", 1)[1], float(v)) for k, v in s.items() if k.startswith("images@"))[0][0]
    h, w = grid_of(main)
    positions = s[f"positions@{main}"]  # [R, NB, K]
    t["outlier_positions"] = torch.stack([above(positions[r].T, r) for r in range(hist.shape[0])]).reshape(
        -1, h, w) / float(s[f"images@{main}"])
    if "variance" in s:
        t["pixel_variance"] = s["variance"].sum(dim=1) / tokens
        t["outlier_pixel_variance"] = torch.stack([above(s["variance"][r], r) for r in range(len(cuts))]) / counts
    if "object" in s:
        weight = s["object_weight"]
        t["object_fraction"] = s["object"].sum(dim=1) / weight.sum(dim=1)
        t["outlier_object_fraction"] = torch.stack([above(s["object"][r], r) / above(weight[r], r)
                                                    for r in range(len(cuts))])
    if "sink_cls" in s:  # block i reads row i
        for source in ("cls", "all"):
            t[f"sink_{source}_outliers"] = torch.stack([above(s[f"sink_{source}"][i], i) for i in range(len(blocks))
                                                        ]) / n
            t[f"sink_{source}_prefix"] = s[f"sink_{source}_prefix"] / n
        if not starts_with_cls(analysis.prefix_kinds):  # no CLS query: its share is unmeasured, not 0 where no bin is
            t["sink_cls_outliers"] = torch.full_like(t["sink_cls_outliers"], float("nan"))
    t.update(_massive(s, mx, n))
    if "neuron_sum" in s:  # block i writes row i + 1
        t.update(_neurons_of(s["neuron_sum"], hist, cuts))
    t.update(_kept_images(analysis.chosen, main))
    meta.update(_findings(t, meta, cuts))
    return ArtifactsResult(analysis.name, t, meta)


def _massive(s: dict, mx: dict, n: int) -> dict[str, torch.Tensor]:
    if "massive_count" not in s:
        return {}
    return {"massive_count": s["massive_count"], "massive_max_ratio": mx["max_massive_ratio"],
            "massive_max": mx["max_massive"], "massive_top3": s["massive_top3"] / n,
            "massive_median": s["massive_median"] / n, "massive_ratio_by_dim": mx["max_ratio_by_dim"],
            "massive_count_by_dim": s["massive_by_dim"], "massive_count_by_token": s["massive_by_token"]}


def _neurons_of(sums: torch.Tensor, hist: torch.Tensor, cuts: list[int | None]) -> dict[str, torch.Tensor]:
    """Mean |activation| of every unit on the outliers of its block's output, and that over the other tokens'."""
    blocks, _, units = sums.shape
    mean = torch.full((blocks, units), float("nan"), dtype=torch.float64)
    concentration = mean.clone()
    for i in range(blocks):
        e = cuts[i + 1]
        if e is None:
            continue
        n_out, n_rest = hist[i + 1, e:].sum(), hist[i + 1, :e].sum()
        if n_out > 0:
            mean[i] = sums[i, e:].sum(dim=0) / n_out
            rest = sums[i, :e].sum(dim=0) / n_rest if n_rest > 0 else torch.zeros(units, dtype=torch.float64)
            concentration[i] = mean[i] / rest.clamp_min(1e-12)  # a unit silent elsewhere: large, not inf
    return {"neuron_outlier_mean": mean, "neuron_concentration": concentration}


def _kept_images(chosen: dict, main: str) -> dict[str, torch.Tensor]:
    kept = sorted(i for i, (_, _, grid) in chosen.items() if grid == main)
    if not kept:
        return {}
    h, w = grid_of(main)
    out = {"norm_maps": torch.stack([chosen[i][0].float() for i in kept]).reshape(len(kept), -1, h, w),
           "norm_map_indices": torch.tensor(kept, dtype=torch.int64)}
    if all(chosen[i][1] is not None for i in kept):
        out["pictures"] = torch.stack([chosen[i][1] for i in kept])
    return out


def _findings(t: dict, meta: dict, cuts: list[int | None]) -> dict[str, Any]:
    """The one-line answers: where outliers start, which heads sink, which dims and units carry them."""
    rows, blocks = meta["rows"], meta["blocks"]
    with_outliers = [r for r in range(len(cuts)) if float(t["outlier_fraction"][r]) > 0]
    found: dict[str, Any] = {
        "thresholds": [None if math.isnan(v) else float(v) for v in t["threshold"].tolist()],
        "rows_with_outliers": [rows[r] for r in with_outliers],
        "first_block": None if not with_outliers else ("embedding" if with_outliers[0] == 0
                                                       else blocks[with_outliers[0] - 1]),
    }
    if "sink_cls_outliers" in t:
        found.update(_sink_heads(t, meta))
    if "massive_count" in t:
        ratio = t["massive_max_ratio"]
        top = int(torch.argmax(ratio))
        dims = t["massive_ratio_by_dim"][top]
        found["massive"] = {
            "blocks_with_massive": [blocks[i] for i in range(len(blocks)) if float(t["massive_count"][i]) > 0],
            "largest_ratio": float(ratio[top]), "largest_ratio_block": blocks[top],
            "largest_ratio_dims": [int(d) for d in torch.argsort(-dims)[:3].tolist()]}
    if "neuron_outlier_mean" in t:
        score = t["neuron_outlier_mean"].nan_to_num(-1.0)
        order = torch.argsort(-score.flatten())[: meta["top_neurons"]].tolist()
        units = score.shape[1]
        found["register_neurons"] = [
            {"block": blocks[k // units], "unit": k % units, "outlier_mean": float(score.flatten()[k]),
             "concentration": float(t["neuron_concentration"].flatten()[k])}
            for k in order if float(score.flatten()[k]) >= 0]
    return found


def _sink_criterion(prefix_kinds: list[str] | tuple[str, ...]) -> str:
    """Which share lists the sink heads: the CLS query's (``"cls_share"``) where the model has a CLS token, else
    the mean over all queries (``"all_share"``, Gu et al. 2024's per-key score): a model without one (SigLIP,
    I-JEPA, AIMv2 pool the mean) has no query that stands for the image."""
    return "cls_share" if starts_with_cls(prefix_kinds) else "all_share"


def _sink_heads(t: dict, meta: dict) -> dict[str, Any]:
    """``sink_heads``: the heads giving at least ``sink_share`` of their attention to the outliers, largest first,
    each with its share under the criterion's name; ``sink_criterion``: that name (:func:`_sink_criterion`)."""
    criterion = _sink_criterion(meta["prefix_kinds"])
    share = t[_SINK_SCORES[criterion]]  # [L, H]
    blocks = meta["blocks"]
    heads = [(blocks[i], h, float(share[i, h])) for i in range(share.shape[0])
             for h in range(share.shape[1]) if float(share[i, h]) >= meta["sink_share"]]
    return {"sink_criterion": criterion,
            "sink_heads": [{"block": b, "head": h, criterion: v} for b, h, v in sorted(heads, key=lambda x: -x[2])]}


def _histograms(t: dict, rows: list[str], path: Path) -> list[Path]:
    from vitscope.viz.artifact_figures import norm_histograms

    return norm_histograms(t["norm_histogram"], t["norm_edges"], t["threshold"], rows, path)


def _maps(t: dict, m: dict, path: Path) -> list[Path]:
    from vitscope.viz.artifact_figures import outlier_maps

    return outlier_maps(t, m, path)


def _neurons(m: dict, path: Path) -> list[Path]:
    from vitscope.viz.artifact_figures import neuron_ranking

    return neuron_ranking(m["register_neurons"], path)
