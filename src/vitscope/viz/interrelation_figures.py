"""Figures of the SIFT patch interrelation (paper 003 figures 3, 5, 6 and 7a).

matplotlib object API only (no pyplot). Every function writes ``<stem>.png`` and ``<stem>.svg`` and
returns both paths.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

from vitscope.viz.attention_maps import as_numpy as _np
from vitscope.viz.attention_maps import tick_labels as _labels
from vitscope.viz.ranges import legend_note
from vitscope.viz.save import outside_legend, save_figure

__all__ = ["STAGE_COLOURS", "focus_figure", "keypoint_grid_figure", "kk_nk_figure", "stages_figure"]

STAGE_COLOURS = {"retrieval": "#dbe9f6", "capture": "#fde2c8", "coach": "#d9f0d3"}
_LINE = {"KK": "tab:blue", "NK": "tab:orange", "KN": "tab:green", "NN": "tab:red"}


def keypoint_grid_figure(images: torch.Tensor, counts: torch.Tensor, stem: str | Path) -> list[Path]:
    """Figure 3: each image with its SIFT keypoints and the patch grid, keypoint patches shaded.

    Args:
        images: ``[I, H, W, 3]`` uint8 at model resolution.
        counts: ``[I, h, w]`` keypoints per patch.
        stem: output path without suffix.
    """
    from vitscope.functional.sift import sift_keypoints

    n = max(len(images), 1)
    rows = -(-n // 3)  # at most three images a row, rows balanced: the title stays readable on a narrow page
    cols = -(-n // rows)
    fig = Figure(figsize=(2.6 * cols, 2.9 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).reshape(-1)
    for ax, img, cnt in zip(axes, images, counts):
        arr = img.cpu().numpy()
        height, width = arr.shape[:2]
        h, w = cnt.shape
        ax.imshow(arr, extent=(0, width, height, 0))
        shade = np.where(cnt.cpu().numpy() > 0, 0.35, np.nan)
        ax.imshow(shade, cmap="autumn", vmin=0, vmax=1, alpha=0.45, extent=(0, width, height, 0))
        for r in range(1, h):
            ax.axhline(r * height / h, color="white", lw=0.5, alpha=0.8)
        for c in range(1, w):
            ax.axvline(c * width / w, color="white", lw=0.5, alpha=0.8)
        pts = sift_keypoints(arr)
        if len(pts):
            ax.scatter(pts[:, 0], pts[:, 1], s=10, c="lime", edgecolors="black", linewidths=0.4)
        ax.set_title(f"{len(pts)} keypoints, {int((cnt > 0).sum())}/{h * w} patches", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in axes[n:]:
        ax.set_axis_off()
    fig.suptitle("SIFT keypoints and the patch grid (shaded: keypoint patches)", fontsize=9)
    return save_figure(fig, stem)


def kk_nk_figure(tensors: Mapping[str, torch.Tensor], stem: str | Path, block_labels: Sequence | None = None,
                 meta: Mapping | None = None) -> list[Path]:
    """Figure 5: KK and NK per block (mean over heads, band: range over heads), with the random baseline
    (dashed) and the band of KK that the stage rule reads (hatched: mean +- ``meta["band"]`` std over images)."""
    kk, nk = _np(tensors["KK"]), _np(tensors["NK"])
    labels = _labels(kk.shape[0], block_labels)
    x = np.arange(kk.shape[0])
    fig = Figure(figsize=(5.5, 3.4), layout="constrained")
    ax = fig.subplots()
    for name, arr in (("KK", kk), ("NK", nk)):
        ax.plot(x, np.nanmean(arr, axis=1), marker="o", color=_LINE[name], label=name)
        if np.isfinite(arr).any():
            ax.fill_between(x, np.nanmin(arr, axis=1), np.nanmax(arr, axis=1), color=_LINE[name], alpha=0.15)
    if "random_KK_blocks" in tensors:
        band = float((meta or {}).get("band", 1.0))
        base, spread = _np(tensors["random_KK_blocks"]), band * _np(tensors["random_KK_blocks_std"])
        ax.plot(x, base, ls="--", color=_LINE["KK"], lw=1, label="random attention KK (baseline)")
        ax.fill_between(x, base - spread, base + spread, facecolor="none", edgecolor=_LINE["KK"], hatch="///",
                        lw=0, alpha=0.5, label=f"random KK ± {band:g} std")
        ax.plot(x, _np(tensors["random_NK_blocks"]), ls="--", color=_LINE["NK"], lw=1,
                label="random attention NK (baseline)")
    ax.set_xticks(x, labels)
    ax.set_xlabel("block")
    ax.set_ylabel("weighted interrelation")
    ax.set_ylim(0, 1)
    legend_note(ax, [kk, nk])
    rule = f" (lam={meta.get('lam')}, rule={meta.get('rule')}, {meta.get('num_images')} images)" if meta else ""
    ax.set_title("Interrelation from keypoint (KK) and non-keypoint (NK) patches" + rule, fontsize=8)
    outside_legend(ax, fontsize=8)
    return save_figure(fig, stem)


def focus_figure(focus: torch.Tensor, stem: str | Path, block_labels: Sequence | None = None) -> list[Path]:
    """Figure 6: attention focus index of every head per block (lower = more focused), mean in black."""
    arr = _np(focus)
    labels = _labels(arr.shape[0], block_labels)
    x = np.arange(arr.shape[0])
    fig = Figure(figsize=(5.5, 3.4), layout="constrained")
    ax = fig.subplots()
    for hd in range(arr.shape[1]):
        ax.plot(x, arr[:, hd], color="tab:gray", alpha=0.5, lw=0.8)
    ax.plot(x, arr.mean(axis=1), color="black", marker="o", label="mean over heads")
    ax.set_xticks(x, labels)
    ax.set_xlabel("block")
    ax.set_ylabel("focus index (nats)")
    ax.set_title("Attention focus index per head (lower = more focused)", fontsize=9)
    outside_legend(ax, fontsize=8)
    return save_figure(fig, stem)


def stages_figure(tensors: Mapping[str, torch.Tensor], stages: Mapping[str, Sequence[int]], stem: str | Path,
                  block_labels: Sequence | None = None, verdict: str = "") -> list[Path]:
    """Figure 7a: KK, KN, NK, NN per block with the retrieval / capture / coach stages shaded, focus index on
    a second axis; ``verdict`` (the stage rule's sentence) is written under the title when there are no
    stages."""
    kk = _np(tensors["KK"])
    labels = _labels(kk.shape[0], block_labels)
    x = np.arange(kk.shape[0])
    fig = Figure(figsize=(6.0, 3.6), layout="constrained")
    ax = fig.subplots()
    position = {str(v): i for i, v in enumerate(labels)}
    for stage, blocks in stages.items():
        idx = [position[str(b)] for b in blocks if str(b) in position]
        if idx:
            ax.axvspan(min(idx) - 0.5, max(idx) + 0.5, color=STAGE_COLOURS.get(stage, "#eeeeee"), zorder=0)
            ax.text((min(idx) + max(idx)) / 2, 1.01, stage, ha="center", va="bottom", fontsize=8,
                    transform=ax.get_xaxis_transform())
    for name in ("KK", "KN", "NK", "NN"):
        ax.plot(x, np.nanmean(_np(tensors[name]), axis=1), marker="o", color=_LINE[name], label=name)
    ax.set_xticks(x, labels)
    ax.set_xlim(-0.5, len(x) - 0.5)
    ax.set_ylim(0, 1)
    ax.set_xlabel("block")
    ax.set_ylabel("weighted interrelation")
    if verdict.startswith("no stage structure"):
        ax.set_title("no stage structure (the caption says why)", fontsize=8)
    twin = ax.twinx()
    twin.plot(x, _np(tensors["focus_normalised"]).mean(axis=1), color="black", ls="--", label="focus / log K")
    twin.set_ylabel("focus index / log K")
    legend_note(ax, [np.nanmean(_np(tensors[name]), axis=1) for name in ("KK", "KN", "NK", "NN")])
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    outside_legend(ax, lines[0] + more[0], lines[1] + more[1], fontsize=7)
    return save_figure(fig, stem)
