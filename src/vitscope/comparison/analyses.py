"""The analyses one comparison pass runs on a model: pooled features, plus the chosen (default: attention) ones.

Every model keeps :class:`PooledFeatures` (clustering purity, k-NN accuracy and CKA between models come from
them). Without a selection a transformer also runs the attention distance, the CLS (or spatial-average) maps
of the dataset and of a few images for the report's explorer, and the saliency IoU when the data has masks.
A selection (``--analyses``, names and groups as ``vitscope analyze`` takes them, configured by ``--param``)
replaces that default set: ``attention_distance`` and ``saliency_iou`` give curves, the maps give explorers,
and every other analysis (or labelled instance, ``cka@cls``) is reported per model.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from vitscope.analyses.attention.base import has_cls_token
from vitscope.analyses.base import Analysis
from vitscope.analyses.data_checks import DataFacts
from vitscope.analyses.params import build_analyses
from vitscope.analyses.registry import ANALYSES, why_skipped
from vitscope.analyses.result import Result
from vitscope.comparison.pooled import PooledFeatures
from vitscope.models.spec import ModelSpec

__all__ = ["CURVE_SOURCES", "compare_analyses", "compare_not_run", "default_selection", "shown_by_comparison"]

#: analyses whose results the comparison itself turns into curves (it also shows every explorer a result declares)
CURVE_SOURCES = ("pooled_features", "attention_distance", "saliency_iou")


def shown_by_comparison(key: str, result: Result) -> bool:
    """Whether the comparison shows a model's result ``key`` itself (as curves, or in its explorer section)
    rather than in a section of its own."""
    return key in CURVE_SOURCES or result.explorer_maps() is not None


def default_selection(spec: ModelSpec, targets: Collection[str]) -> list[str]:
    """What runs without ``--analyses``: attention distance, maps, saliency IoU given masks (a CNN, which has
    no attention, runs none of them)."""
    names = ["attention_distance", "cls_attention_maps" if has_cls_token(spec) else "spatial_average_maps"]
    return names + (["saliency_iou"] if "masks" in targets else [])


def compare_analyses(spec: ModelSpec, targets: Collection[str], selection: Sequence[str] | None = None,
                     params: Mapping[str, Mapping[str, Any]] | None = None, data: DataFacts | None = None
                     ) -> tuple[list[Analysis], dict[str, str]]:
    """The analyses of one model's single pass of ``vitscope compare``, and what it cannot run.

    Args:
        spec: the model's spec.
        targets: ground-truth keys the data gives (``masks``, ``label``...).
        selection: analysis and group names (``NAME@TAG`` labels a second configuration); None: the default set.
        params: ``{analysis, group or label: {parameter: value}}`` (:func:`vitscope.analyses.params.build_analyses`).
        data: what is known of the data before the pass (:class:`~vitscope.analyses.data_checks.DataFacts`): a
            named analysis it cannot feed (k-NN on one class) is refused before any model runs.

    Returns:
        ``(analyses, skipped)``: :class:`PooledFeatures` first, then the chosen analyses this model can run;
        ``skipped`` maps each analysis the model cannot run (a CNN has no attention) to the short reason.

    Raises:
        ValueError: an unknown name, a bad parameter, an analysis the data cannot feed (no masks...).
    """
    names = list(selection) if selection else default_selection(spec, targets)
    skipped: dict[str, str] = {}
    chosen = build_analyses(names, spec, targets, params, skipped=skipped, data=data)
    return [PooledFeatures(), *chosen], skipped


def compare_not_run(spec: ModelSpec, targets: Collection[str]) -> dict[str, str]:
    """The measurements of a default comparison (:func:`default_selection`, saliency IoU included) that ``spec`` or
    the data cannot give: name -> reason (a CNN has no attention; saliency IoU needs masks)."""
    reasons = {name: why_skipped(ANALYSES[name](), spec, frozenset(targets))
               for name in default_selection(spec, {*targets, "masks"})}
    return {name: reason for name, reason in reasons.items() if reason is not None}
