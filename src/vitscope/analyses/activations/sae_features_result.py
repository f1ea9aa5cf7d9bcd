"""What the ``sae_features`` analysis reports: every latent's firing frequency and mean activation, its mean
activation per image class and per region, its top images with patch maps, and the feature cards of a few latents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vitscope.analyses.activations.top import TopActivationsResult, map_images
from vitscope.analyses.base import Figure

__all__ = ["SAEFeaturesResult"]

#: above this share of the tokens a latent is dense (and not drawn as a card)
DENSE = 0.1


class SAEFeaturesResult(TopActivationsResult):
    """Result of :class:`~vitscope.analyses.activations.sae_features.SAEFeatures`.

    Tensors: ``frequency`` and ``mean_activation`` ``[L]`` (share of the tokens each latent fires on, its mean code),
    ``class_mean`` ``[C, L]`` with ``class_tokens`` ``[C]`` (labels in ``meta["class_labels"]``), ``region_mean``
    ``[R, L]`` with ``region_tokens`` ``[R]`` (labels in ``meta["region_labels"]``, -1 for the background), the top
    images' ``{hook}.scores``, ``{hook}.indices`` and ``{hook}.maps`` as ``top_activations`` keeps them, and, when
    ``vitscope analyze`` drew them, ``featviz`` ``[n, S, S, 3]`` uint8 (the card latents' encoder directions,
    ``meta["featviz_latents"]``). Meta: ``cards`` (the latents drawn as cards), ``sae`` (path, hook, width, kind,
    tokens read), ``tokens``, and where ``vitscope analyze`` found them in the dataset's reader ``class_names`` and
    ``region_names`` (label -> name, keys as strings).
    """

    DIMS = {"frequency": ("latent",), "mean_activation": ("latent",), "class_mean": ("class", "latent"),
            "region_mean": ("region", "latent"), "class_tokens": ("class",), "region_tokens": ("region",),
            "featviz": ("card", "y", "x", "channel"), **TopActivationsResult.DIMS}

    def arrays(self) -> dict[str, torch.Tensor]:
        """Patch maps and the per-class and per-region means (``[C, L]``: large for a wide SAE) beside the other
        large tensors."""
        big = ("class_mean", "region_mean", "featviz")
        return {**super().arrays(), **{k: t for k, t in self.tensors.items() if k in big}}

    def tables(self) -> dict[str, Any]:
        """``<name>``: one row per latent: frequency, mean activation, and the class and region it is most active on
        (with that mean), the latents as they rank by frequency."""
        import pandas as pd

        t, m = self.tensors, self.meta
        if "frequency" not in t:
            return {self.name: pd.DataFrame({"latent": []})}
        frame = pd.DataFrame({"latent": range(len(t["frequency"])), "frequency": t["frequency"].tolist(),
                              "mean_activation": t["mean_activation"].tolist()})
        for key in ("class", "region"):
            if f"{key}_mean" in t:
                best, at = t[f"{key}_mean"].max(dim=0)
                labels = m.get(f"{key}_labels", [])
                frame[f"top_{key}"] = [labels[int(i)] for i in at]
                frame[f"top_{key}_mean"] = best.tolist()
        return {self.name: frame.sort_values(["frequency", "latent"], ascending=[False, True])}

    def figures(self) -> list[Figure]:
        """``<name>_cards``: a card per chosen latent (top patches over their images, the encoder direction's feature
        visualisation when drawn, the class and region histograms); ``<name>_frequency``: the latents' firing
        frequencies."""
        t, m = self.tensors, self.meta
        if "frequency" not in t:
            return []
        out = [self.figure("_frequency", lambda path: _frequency(t["frequency"], path),
                           "How often each latent fires (share of the tokens it reads on which its code is positive, "
                           "log scale); latents that never fired are counted apart, those above 10 % are dense.",
                           "Bricken et al. 2023, Towards Monosemanticity", title="SAE latents: firing frequency")]
        cards = list(m.get("cards", []))
        hook = (m.get("sae") or {}).get("hook")
        if cards and hook and f"{hook}.maps" in t:
            out.append(self.figure("_cards", lambda path: self._draw_cards(cards, hook, path),
                                   "Feature cards: for each latent, the images that activate it most with its "
                                   "activation over their patches (left: most), the feature visualisation of its "
                                   "encoder direction when drawn, and its mean activation per image class and per "
                                   "region under the tokens (objects or parts from the masks; bg: background).",
                                   "Bricken et al. 2023; Olah et al. 2017, Feature Visualization",
                                   title=f"SAE feature cards: {hook}"))
        return out

    def _draw_cards(self, cards: list[int], hook: str, path: Path) -> list[Path]:
        from vitscope.viz.labels import short_name
        from vitscope.viz.sae_cards import feature_cards

        t, m = self.tensors, self.meta
        mapped = list(m["mapped"][hook])
        rows = [mapped.index(c) for c in cards]
        maps = map_images(t[f"{hook}.maps"], t.get(f"{hook}.map_grids"))
        order = list(m["channels"][hook])
        index = {i: n for n, i in enumerate(m.get("picture_indices", []))}
        pictures = t.get("pictures")
        paths = m.get("paths", {})
        cells = []
        for c, r in zip(cards, rows):
            ids = [int(i) for i in t[f"{hook}.indices"][order.index(c)].tolist()]
            scores = t[f"{hook}.scores"][order.index(c)].tolist()
            shown = [j for j, s in enumerate(scores) if s > 0]
            cells.append({"maps": [maps[r][j] for j in shown], "scores": [scores[j] for j in shown],
                          "pictures": [None if pictures is None or ids[j] not in index else pictures[index[ids[j]]]
                                       for j in shown],
                          "names": [Path(paths[str(ids[j])]).name if str(ids[j]) in paths else None for j in shown]})
        featviz = {}
        if "featviz" in t:
            featviz = {int(c): t["featviz"][n] for n, c in enumerate(m.get("featviz_latents", []))}
        histograms = {}
        for key in ("class", "region"):
            if f"{key}_mean" in t:
                names = m.get(f"{key}_names") or {}
                labels = ["bg" if key == "region" and v == -1 else short_name(names.get(str(v), str(v)), 14)
                          for v in m.get(f"{key}_labels", [])]
                histograms[key] = (labels, t[f"{key}_mean"])
        freq = t["frequency"]
        return feature_cards(cards, [float(freq[c]) for c in cards], cells, featviz, histograms, hook, path)


def _frequency(frequency: torch.Tensor, path: Path) -> list[Path]:
    from vitscope.viz.sae_cards import frequency_histogram

    return frequency_histogram(frequency, DENSE, path)
