"""The feature-visualisation experiments' curves as browser charts (twins of :mod:`vitscope.viz.featviz_figures`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vitscope.viz.charts import Chart, curve, value_lines_chart

__all__ = ["spatial_information_chart"]


def spatial_information_chart(fractions: torch.Tensor, count_ratio: torch.Tensor, sum_ratio: torch.Tensor,
                              labels: Sequence[str]) -> Chart:
    """Paper 001 appendix F: active patches (count, then sum) over their initial value against the fraction of
    active patches removed, one line per block, with the linear ``1 - x`` of a channel that keeps space.

    Args:
        fractions: ``[F]`` removed fractions.
        count_ratio, sum_ratio: ``[L, F]`` ratios per block.
        labels: ``L`` block names.
    """
    x = [float(v) for v in fractions.tolist()]
    panels = []
    for ratio, what in ((count_ratio, "count"), (sum_ratio, "sum")):
        lines = [curve(str(name), ratio[i], str(name), x=x) for i, name in enumerate(labels)]
        lines.append(curve("linear (1 - x)", [1.0 - v for v in x], "", "dashed", x))
        panels += value_lines_chart(lines, "fraction of active patches removed", f"active patches ({what}) / initial",
                                    f"Active patches by {what}", (0.0, max(x))).panels
    return Chart(panels)
