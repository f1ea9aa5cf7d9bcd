"""Per-token mean and variance of activations over images (``MeanActivation``)."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence

import torch

from vitscope.analyses.base import Analysis, Batch, Figure, Result
from vitscope.analyses.grids import by_images, grid_key
from vitscope.analyses.registry import register_analysis
from vitscope.errors import VitscopeValueError
from vitscope.functional.moments import merge_moments
from vitscope.hooks.names import UnknownHookError, cnn_hook_names, expand_names, transformer_hook_names
from vitscope.hooks.tokens import grid_to_tokens
from vitscope.models.spec import ModelSpec
from vitscope.strict_json import note_null

__all__ = ["CNN_DEFAULT_HOOKS", "TRANSFORMER_DEFAULT_HOOKS", "MeanActivation", "MeanActivationResult"]

TRANSFORMER_DEFAULT_HOOKS: tuple[str, ...] = ("blocks.*.resid_post",)
CNN_DEFAULT_HOOKS: tuple[str, ...] = ("stages.*",)
#: ``save=`` -> the quantities written to the output folder (every one stays in the result in memory)
SAVED: dict[str, tuple[str, ...]] = {"norm": ("token_norm",), "mean": ("token_norm", "mean"),
                                     "all": ("token_norm", "mean", "var")}


def natural_key(name: str) -> list[int | str]:
    """Sort key that puts ``blocks.2`` before ``blocks.10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _as_tokens(x: torch.Tensor, key: str) -> torch.Tensor:
    """``[B, N, D]`` stays, a CNN map ``[B, C, h, w]`` becomes ``[B, h*w, C]``; float64, detached."""
    x = x.detach()
    if x.dim() == 4:
        x = grid_to_tokens(x)
    elif x.dim() != 3:
        raise VitscopeValueError(
            f"mean_activation: '{key}' has shape {tuple(x.shape)}; expected tokens [B, N, D] or a map [B, C, h, w]"
        )
    return x.to(torch.float64)


class MeanActivationResult(Result):
    """Result of :class:`MeanActivation`: the per-token means, variances and token norms of every site.

    ``meta["saved"]`` names the quantities the output folder keeps (``save=`` of the analysis).
    """

    DIMS = {"*.token_norm": ("token",), "*": ("token", "channel")}

    def arrays(self) -> dict[str, torch.Tensor]:
        """The large tensors of the quantities in ``meta["saved"]`` (all of them when it is absent)."""
        saved = tuple(self.meta.get("saved", SAVED["all"]))
        return {k: t for k, t in super().arrays().items() if k.rsplit(".", 1)[-1] in saved}

    def figures(self) -> list[Figure]:
        """``<name>_token_norm``: the norm of every token position's mean vector, one row per site (sites with
        another number of positions, e.g. CNN stages, get a figure each: ``<name>_token_norm_<site>``)."""
        hooks = [h for h in self.meta.get("hooks", []) if f"{h}.token_norm" in self.tensors]
        groups: dict[int, list[str]] = {}
        for h in hooks:
            groups.setdefault(self.tensors[f"{h}.token_norm"].numel(), []).append(h)
        figures = []
        for sites in groups.values():
            rows = torch.stack([self.tensors[f"{h}.token_norm"] for h in sites])
            suffix = "_token_norm" if len(groups) == 1 else f"_token_norm_{sites[0].replace('.', '_')}"
            figures.append(self.heatmap_figure(
                suffix, rows, f"Norm of the mean token, {self.meta.get('num_images', 0)} images", "L2 norm",
                "Norm of the dataset-mean vector of every token position (prefix tokens first, then the spatial "
                "tokens row by row), one row per recorded site; bright columns are tokens with large, "
                "image-independent activations.", block_labels=sites, x_label="token position", y_label="site"))
        return figures


@register_analysis("mean_activation", order=10)
class MeanActivation(Analysis):
    """Mean and variance over images of every token position of the chosen activations.

    State per hook: image count ``n`` (float), ``mean`` ``[N, D]`` and ``M2`` ``[N, D]`` (sum of
    squared deviations over images), all float64 on the CPU. A batch is reduced to its own
    ``(n, mean, M2)`` and folded in with Chan's parallel formula, the same code path as ``merge``:
    ``delta = mean_b - mean_a; mean = mean_a + delta * n_b / n; M2 = M2_a + M2_b + delta^2 n_a n_b / n``.

    CNN maps ``[B, C, h, w]`` are treated as ``h*w`` tokens of width ``C`` (row-major).

    Args:
        hooks: hook names or glob patterns to summarise. Default: ``("blocks.*.resid_post",)``
            for transformers and ``("stages.*",)`` for CNNs.
        ddof: delta degrees of freedom of the reported variance: 0 = population ``M2 / n``
            (default), 1 = unbiased ``M2 / (n - 1)``. Cells with ``n <= ddof`` are NaN.
        save: what the run's output folder keeps of the ``[N, D]`` tensors (the result in memory holds
            all): ``"norm"`` (default) the token norms only, ``"mean"`` also the means, ``"all"`` also
            the variances (``arrays/<name>.npz``). A ViT-S/14 at 518 px: 25 MB per quantity over 12 blocks.

    Result tensors (for every recorded hook): ``"{hook}.mean"`` ``[N, D]``, ``"{hook}.var"``
    ``[N, D]`` and ``"{hook}.token_norm"`` ``[N]`` (L2 norm of the mean vector of each token).
    """

    description = "Mean activation and token norm of the recorded sites, per token position."
    summary = "mean and variance of every token position"


    def __init__(self, hooks: Sequence[str] | None = None, ddof: int = 0, save: str = "norm") -> None:
        if isinstance(hooks, str):
            hooks = (hooks,)
        if ddof < 0:
            raise VitscopeValueError(f"ddof must be >= 0, got {ddof}")
        if save not in SAVED:
            raise VitscopeValueError(f"save must be one of {sorted(SAVED)}, got {save!r}")
        super().__init__()
        self._cfg_hooks: tuple[str, ...] | None = tuple(hooks) if hooks is not None else None
        self._cfg_ddof = int(ddof)
        self._cfg_save = save
        # per hook and token grid ("HOOK@HxW"): image count, mean [N, D] and M2 [N, D] (float64), merged with
        # Chan's formula; images of different grids have different token positions
        self.add_state("count", {}, reduce="sum")
        self.add_state("mean", {}, reduce="mean", count="count")
        self.add_state("m2", {}, reduce="variance", mean="mean", count="count")

    def patterns(self, spec: ModelSpec) -> tuple[str, ...]:
        """The hook names / patterns this instance reads on ``spec``."""
        if self._cfg_hooks is not None:
            return self._cfg_hooks
        return TRANSFORMER_DEFAULT_HOOKS if spec.is_transformer else CNN_DEFAULT_HOOKS

    def required_hooks(self, spec: ModelSpec) -> list[str]:
        return list(self.patterns(spec))

    def supports(self, spec: ModelSpec) -> bool:
        """True when every requested pattern matches a canonical name of this model."""
        valid = transformer_hook_names(spec.num_blocks) if spec.is_transformer else cnn_hook_names(spec.num_blocks)
        try:
            expand_names(self.patterns(spec), valid, model=spec.name)
        except UnknownHookError:
            return False
        return True

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        """Fold one batch in: every record key matching the patterns, ``[B, N, D]`` or ``[B, C, h, w]``."""
        patterns = self.patterns(batch.spec)
        keys = [k for k in record if any(fnmatch.fnmatchcase(k, p) for p in patterns)]
        if not keys:
            raise VitscopeValueError(
                f"mean_activation: the record holds none of {list(patterns)} (it has {sorted(record)[:8]}); "
                "record the names returned by required_hooks(spec)"
            )
        for key in keys:
            moments = self.reduced(key, record, batch)
            if moments is not None:
                self._fold(f"{key}@{grid_key(batch.grid)}", *moments)

    def stream_hooks(self, spec: ModelSpec) -> list[str]:
        return list(self.patterns(spec))

    def reduce_hook(self, name: str, tensor: torch.Tensor, batch: Batch
                    ) -> tuple[float, torch.Tensor, torch.Tensor] | None:
        """``(n, mean [N, D], M2 [N, D])`` of one hook over the batch (None for an empty batch)."""
        x = _as_tokens(tensor, name)
        if x.shape[0] == 0:
            return None
        mean_b = x.mean(dim=0)
        m2_b = (x - mean_b).square().sum(dim=0)
        return float(x.shape[0]), mean_b, m2_b  # kept on the batch's device; the engine brings states home

    def _fold(self, key: str, n_b: float, mean_b: torch.Tensor, m2_b: torch.Tensor) -> None:
        """Chan's parallel merge of ``(n_b, mean_b [N, D], M2_b [N, D])`` into the state of ``key`` (the rule
        the declared ``"mean"`` / ``"variance"`` states merge by)."""
        n_a = self.count.get(key, 0.0)
        if n_b == 0:
            return
        if n_a == 0:
            self.count[key], self.mean[key], self.m2[key] = n_b, mean_b.clone(), m2_b.clone()
            return
        self._check_shape(key, mean_b.shape)
        mean_a, m2_a = self.mean[key].to(mean_b.device), self.m2[key].to(m2_b.device)  # restored: on the CPU
        self.mean[key], self.m2[key] = merge_moments(n_a, mean_a, m2_a, n_b, mean_b, m2_b)
        self.count[key] = n_a + n_b

    def _check_shape(self, key: str, shape: torch.Size) -> None:
        if key in self.mean and shape != self.mean[key].shape:
            (n_old, d_old), (n_new, d_new) = self.mean[key].shape, shape
            what = "tokens" if n_old != n_new else "channels"
            raise VitscopeValueError(
                f"mean_activation: '{key}' has {n_new} tokens of width {d_new} here but {n_old} tokens of "
                f"width {d_old} before (mismatched {what}); per-token statistics need every image at the "
                "same input size, so resize the images to one size or use separate runs"
            )

    def check_mergeable(self, other: Analysis) -> None:
        for key, mean in getattr(other, "mean", {}).items():
            self._check_shape(key, mean.shape)

    def _named(self) -> dict[str, str]:
        """Result name -> state key: each hook's grid of most images as the hook's name, the others ``HOOK@HxW``."""
        grids: dict[str, list[tuple[str, float]]] = {}
        for state in self.count:
            hook, _, grid = state.rpartition("@")
            grids.setdefault(hook, []).append((grid, self.count[state]))
        names = {}
        for hook in sorted(grids, key=natural_key):
            for j, (grid, _) in enumerate(by_images(grids[hook])):
                names[hook if j == 0 else f"{hook}@{grid}"] = f"{hook}@{grid}"
        return names

    def compute(self) -> Result:
        tensors: dict[str, torch.Tensor] = {}
        named = self._named()
        keys = [k for k in named if "@" not in k]
        for key, state in named.items():
            n, mean = self.count[state], self.mean[state]
            if n > self._cfg_ddof:
                var = self.m2[state] / (n - self._cfg_ddof)
            else:
                var = torch.full_like(mean, float("nan"))
            tensors[f"{key}.mean"] = mean.clone()
            tensors[f"{key}.var"] = var
            tensors[f"{key}.token_norm"] = mean.norm(dim=-1)
        per_hook: dict[str, float] = {}
        for state, n in self.count.items():
            per_hook[state.rpartition("@")[0]] = per_hook.get(state.rpartition("@")[0], 0) + n
        num_images = int(max(per_hook.values())) if per_hook else 0
        meta = {"num_images": num_images, "hooks": keys, "ddof": self._cfg_ddof, "saved": list(SAVED[self._cfg_save])}
        if len(named) > len(keys):  # images of several grids: each grid's token positions apart
            first = keys[0]
            meta["grids"] = {state.partition("@")[2]: int(self.count[state]) for name, state in named.items()
                             if name == first or name.startswith(first + "@")}
        for key, state in named.items():
            if self.count[state] <= self._cfg_ddof:
                note_null(meta, f"{key}.var", f"a variance with ddof={self._cfg_ddof} needs more than "
                          f"{self._cfg_ddof} image(s)")
        return MeanActivationResult(name=self.name, tensors=tensors, meta=meta)
