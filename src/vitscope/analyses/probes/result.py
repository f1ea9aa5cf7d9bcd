"""``ProbeResult``: per-block scores of one task with its random-chance baseline, and the best-block table.

Every probe (k-NN, linear, clustering, retrieval, video propagation, keypoints) returns a ProbeResult:
tensors ``<metric>`` ``[L]`` (one score per block in ``meta["blocks"]``) and ``random_<metric>`` (0-dim,
the same task on random features of the same shape, docs/methods.md, Probes per block "Random chance"). ``meta`` holds
``task``, ``metrics`` (names, the first is the headline metric), ``model`` and the task's settings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import torch

from vitscope.analyses.base import Figure, Result

__all__ = ["CAPTIONS", "ProbeResult", "best_block_table", "probe_result"]

#: analysis or task -> (caption with ``{metric}``, paper figure) of its per-block curves
CAPTIONS: dict[str, tuple[str, str]] = {
    "clustering": ("Clustering score ({metric}) per block, k-means on image features; random chance dashed.",
                   "paper 002, fig. 7 and 24, 25"),
    "knn_probe": ("k-NN {metric} per block on held-out images; random chance dashed.",
                  "paper 002, fig. 9 (left) and 28"),
    "linear_probe": ("Linear-probe {metric} per block on held-out images; random chance dashed.", "paper 002, fig. 9"),
    "retrieval": ("Retrieval {metric} per block (revisited Oxford / Paris protocol); random chance dashed.",
                  "paper 002, fig. 8"),
    "davis": ("Video label propagation {metric} per block (DAVIS 2017); random chance dashed.", "paper 002, fig. 10"),
    "keypoints": ("Keypoint correspondence {metric} per block (SPair-71k); random chance dashed.",
                  "paper 002, fig. 10"),
}
CAPTIONS["knn"], CAPTIONS["linear"] = CAPTIONS["knn_probe"], CAPTIONS["linear_probe"]  # the probe sweep's tasks
CAPTIONS["clustering_regions"] = ("Clustering score ({metric}) per block, k-means on region features (each object "
                                  "or part mask pooled over its patches); random chance dashed.",
                                  "paper 002, fig. 7 and 24, 25")


class ProbeResult(Result):
    """Per-block probe scores: one curve per metric with its random-chance line."""

    DIMS = {"*": ("block",)}

    @property
    def metrics(self) -> list[str]:
        return list(self.meta.get("metrics", []))

    def best(self, metric: str | None = None) -> tuple[int, float]:
        """``(block, score)`` of the best block for ``metric`` (default: the headline metric)."""
        metric = metric or self.metrics[0]
        values = self.tensors[metric].double()
        if torch.isnan(values).all():
            return -1, math.nan
        pos = int(torch.nan_to_num(values, nan=-math.inf).argmax())
        return int(self.meta["blocks"][pos]), float(values[pos])

    def figures(self) -> list[Figure]:
        """``<name>_<metric>``: one curve per metric with its random-chance line."""
        if not self.metrics or self.metrics[0] not in self.tensors:
            return []
        task = self.meta.get("task", self.name)
        caption, paper = CAPTIONS.get(self.base_name, CAPTIONS.get(task, ("{metric} per block, random chance "
                                                                          "dashed.", "paper 002, table 1")))

        def curve(metric: str):
            def draw(path: Path) -> list[Path]:
                from vitscope.viz.probe_figures import probe_curves

                random = self.tensors.get(f"random_{metric}")
                return probe_curves({self.meta.get("model", "model"): self.tensors[metric]}, metric,
                                    f"{task}: {metric} per block", path,
                                    random=None if random is None else float(random), blocks=self.meta.get("blocks"))
            return draw

        return [self.figure(f"_{metric.replace('@', '_at_').replace('&', 'and')}", curve(metric),
                            caption.format(metric=metric), paper, chart=self._chart(task, metric))
                for metric in self.metrics if metric in self.tensors]

    def _chart(self, task: str, metric: str):
        """The metric per block with the random-chance score as a dashed line."""
        from vitscope.viz.charts import block_lines_chart, curve
        from vitscope.viz.labels import label, sentence_case
        from vitscope.viz.ranges import PROBE_RANGE, quantity_range

        model, values = self.meta.get("model") or "model", self.tensors[metric]
        lines = [curve(model, values, model)]
        random = self.tensors.get(f"random_{metric}")
        if random is not None:
            lines.append(curve("random chance", [float(random)] * values.shape[0], "", "dashed"))
        bounds = quantity_range(metric) or PROBE_RANGE  # a probe score's documented range (ARI from -1/2)
        return block_lines_chart(lines, label(metric), values.shape[0], self.meta.get("blocks"),
                                 sentence_case(f"{label(task)}: {label(metric)} per block"), bounds)


def probe_result(name: str, task: str, blocks: list[int], scores: Mapping[str, list[float]],
                 random: Mapping[str, float] | None, **meta: object) -> ProbeResult:
    """Build a ProbeResult from per-block score lists (metric order = insertion order of ``scores``)."""
    tensors = {m: torch.tensor(v, dtype=torch.float64) for m, v in scores.items()}
    for m, v in (random or {}).items():
        tensors[f"random_{m}"] = torch.tensor(float(v), dtype=torch.float64)
    return ProbeResult(name, tensors, {"task": task, "metrics": list(scores), "blocks": list(blocks), **meta})


def best_block_table(results: Mapping[str, Mapping[str, ProbeResult]]):
    """Best block per model and task (paper 002 table 1), as a pandas DataFrame.

    Args:
        results: ``{model: {task: ProbeResult}}``.

    Returns:
        One row per (model, task, metric): ``model``, ``task``, ``metric``, ``best_block``, ``score``,
        ``last_block_score``, ``random`` (the random-chance score) and ``above_random``.
    """
    import pandas as pd

    rows = []
    for model, tasks in results.items():
        for task, res in tasks.items():
            for metric in res.metrics:
                if metric not in res.tensors:
                    continue
                block, score = res.best(metric)
                random_t = res.tensors.get(f"random_{metric}")
                random = float(random_t) if random_t is not None else math.nan
                rows.append({"model": model, "task": task, "metric": metric, "best_block": block, "score": score,
                             "last_block_score": float(res.tensors[metric][-1]), "random": random,
                             "above_random": score - random})
    return pd.DataFrame(rows, columns=["model", "task", "metric", "best_block", "score", "last_block_score",
                                       "random", "above_random"])
