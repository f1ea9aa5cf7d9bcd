"""The demo's paired-similarity section (paper 000): a few image pairs explained with the metric model.

Kept on its own so it can follow the explain package as it grows: it only calls
``vitscope.explain.PairedSimilarity(backbone, projection="head").explain(images_a, images_b)``.
Maps: bicubic upsampling, a diverging colour map around each map's even share (its mean), one colour bar
per image; a retrieval explorer toggles models and redistributions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vitscope.analyses.result import Figure
from vitscope.errors import VitscopeValueError
from vitscope.report.model import Section, Table
from vitscope.report.tables import format_cell

__all__ = ["EXPLORER_MODELS", "choose_pairs", "paired_similarity_section", "retrieval_explorer"]

#: the embedding models the demo's retrieval explorer toggles between (paper 000's three networks)
EXPLORER_MODELS = ("tiny-vit-metric", "tiny-vit-metric-p16", "tiny-resnet-metric")


def choose_pairs(labels: Sequence[int], num_same: int = 3, num_different: int = 1) -> list[tuple[int, int]]:
    """Deterministic pairs of dataset positions: ``num_same`` pairs sharing a label (each from a different label
    where possible), then ``num_different`` pairs with different labels."""
    by_label: dict[int, list[int]] = {}
    for i, y in enumerate(labels):
        if y is not None and y >= 0:
            by_label.setdefault(int(y), []).append(i)
    same = [(v[0], v[1]) for _, v in sorted(by_label.items()) if len(v) >= 2][:num_same]
    firsts = [v[0] for _, v in sorted(by_label.items())]
    different = [(firsts[k], firsts[k + 1]) for k in range(0, len(firsts) - 1, 2)][:num_different]
    return same + different


def paired_similarity_section(dataset: Any, model: str = "tiny-vit-metric",
                              num_pairs: int = 4) -> tuple[Section, dict[str, Any]]:
    """Explain ``num_pairs`` pairs of ``dataset`` with ``model``; return the report section (its figure, drawn by
    the writer to ``figures/paired_similarity.png``) and a JSON-able summary for results.json.

    Args:
        dataset: an engine dataset with labels in its targets (e.g. ``as_source("root::coco")``).
        model: a metric-learning model whose head is the embedding projection.
    """
    from vitscope.explain import PairedSimilarity
    from vitscope.models.load import load_model

    n = min(len(dataset), 200)
    labels = [dataset.targets(i).get("label", -1) for i in range(n)]
    pairs = choose_pairs(labels, num_same=max(1, num_pairs - 1), num_different=1)[:num_pairs]
    if not pairs:
        raise VitscopeValueError("the paired-similarity section needs labelled images (at least two of one class)")
    backbone = load_model(model)
    items_a = [dataset.get(a) for a, _ in pairs]
    items_b = [dataset.get(b) for _, b in pairs]
    explainer = PairedSimilarity(backbone, projection="head")
    exp = explainer.explain([it.image for it in items_a], [it.image for it in items_b])
    size = tuple(backbone.spec.image_size)
    pictures_a = [np.asarray(it.image.convert("RGB").resize(size[::-1])) for it in items_a]
    pictures_b = [np.asarray(it.image.convert("RGB").resize(size[::-1])) for it in items_b]
    scores = exp.score.tolist()
    names = [Path(dataset.path(i)).name for i in range(n)]
    classes = list(getattr(getattr(dataset, "dataset", None), "classes", []) or [])

    def class_name(i: int) -> str:
        return str(classes[labels[i]]) if 0 <= labels[i] < len(classes) else str(labels[i])

    titles = [f"{names[a]} and {names[b]}: {'both ' + class_name(a) if labels[a] == labels[b] else 'different classes'}"
              f", cosine {s:.3f}" for (a, b), s in zip(pairs, scores)]
    map_a, map_b = exp.map_a.numpy(), exp.map_b.numpy()

    def draw(path: Path) -> list[Path]:
        from vitscope.viz.explain_figures import signed_pair_picture

        return signed_pair_picture(list(zip(pictures_a, pictures_b, map_a, map_b, titles)), path)

    rows = [[k, names[a], names[b], class_name(a), class_name(b), format_cell(s), format_cell(float(ra.sum())),
             format_cell(float(rb.sum()))]
            for k, ((a, b), s, ra, rb) in enumerate(zip(pairs, scores, exp.raw_a, exp.raw_b))]
    table = Table("Explained pairs", ["pair", "image a", "image b", "class a", "class b", "cosine similarity",
                                      "sum of map a", "sum of map b"], rows,
                  "Each image's token contributions sum exactly to the pair's cosine similarity (before rollout).")
    figure = Figure("paired_similarity", draw, "Paired similarity", "Paired similarity maps: which patches of each "
                    f"image make the pair similar, for the metric-learning model {model}. The contributions of each "
                    "image sum to the cosine similarity; red patches contribute more than an even share of it, blue "
                    "ones less (each map on its own scale, shown below it).", "paper 000, fig. 4")
    section = Section("paired-similarity", "Paired similarity",
                      "Why two images are similar to an embedding network: the cosine similarity of the two "
                      "mean-pooled, projected embeddings decomposed over the tokens of each image and redistributed "
                      "over the input patches with the attention rollout (docs/methods.md, Paired image similarity).",
                      [figure], [table], pair_explorers=[e for e in [retrieval_explorer(dataset, names[:n], labels,
                                                                                         class_name)] if e is not None])
    summary = {"model": model, "pairs": [{"a": a, "b": b, "file_a": names[a], "file_b": names[b],
                                          "label_a": labels[a], "label_b": labels[b], "score": s}
                                         for (a, b), s in zip(pairs, scores)],
               "files": ["figures/paired_similarity.png"]}
    return section, summary


def retrieval_explorer(dataset: Any, names: Sequence[str], labels: Sequence[int], class_name: Any,
                       models: Sequence[str] = EXPLORER_MODELS, num_queries: int = 8, k: int = 4,
                       gallery: int = 64):
    """Each query's top-``k`` hits in a gallery with both paired maps, per embedding model and, for
    transformers, per redistribution (the published ``R gamma`` and the sum-preserving ``R^T gamma``).

    Args:
        dataset: the engine dataset (images by position); names, labels: per position; class_name(i): the
            class of position ``i`` as text.
        models: metric-learning models whose head is the embedding projection.
        num_queries: the first positions whose class has another image in the gallery are the queries.

    Returns:
        The explorer, or None when the gallery has no two images of one class or an unreadable image.
    """
    import torch

    from vitscope.explain import PairedSimilarity
    from vitscope.models.load import load_model
    from vitscope.report.pair_explorer import pair_explorer

    n = min(len(dataset), gallery, len(labels))
    items = [dataset.get(i) for i in range(n)]
    if n < 2 or any(item is None for item in items):  # unreadable images: the section keeps its other parts
        return None
    k = min(k, n - 1)
    queries = [i for i in range(n) if sum(labels[j] == labels[i] for j in range(n)) > 1][:num_queries]
    if not queries:
        return None
    hits: dict[str, dict[str, list]] = {}
    thumbnails = None
    for model in models:
        backbone = load_model(model)
        explainer = PairedSimilarity(backbone, projection="head")
        encoded = explainer.encode([it.image for it in items])
        if thumbnails is None:
            size = tuple(backbone.spec.image_size)
            thumbnails = [np.asarray(it.image.convert("RGB").resize(size[::-1])) for it in items]
        emb = torch.nn.functional.normalize(encoded.embeddings, dim=-1)
        sims = emb[queries] @ emb.T
        sims[torch.arange(len(queries)), torch.as_tensor(queries)] = -float("inf")  # not the query itself
        top = sims.topk(k, dim=-1)
        pairs_q = [q for q in queries for _ in range(k)]
        pairs_j = top.indices.reshape(-1).tolist()
        kinds = {"published (R gamma)": False, "sum-preserving (R^T gamma)": True} if explainer.use_rollout \
            else {"raw (no rollout)": False}
        hits[model] = {}
        for kind, transpose in kinds.items():
            explainer.transpose = transpose
            exp = explainer.explain_indices(encoded, pairs_q, encoded, pairs_j)
            per_query = []
            for r in range(len(queries)):
                rows = range(r * k, (r + 1) * k)
                per_query.append([(pairs_j[i], float(exp.score[i]), exp.map_a[i].numpy(), exp.map_b[i].numpy())
                                  for i in rows])
            hits[model][kind] = per_query
    return pair_explorer("Retrieval explorer: pick a query", thumbnails or [], names[:n],
                         [class_name(i) for i in range(n)], hits, queries,
                         caption=f"Each query's {k} most similar gallery images for the chosen model, with both "
                                 "paired maps over the images (red: a patch adds more than an even share of the "
                                 "map, blue: less). The transformers' maps can be redistributed as the published "
                                 "code does (R gamma) or so that they keep the sum (R^T gamma).")
