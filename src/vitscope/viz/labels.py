"""Names as people write them in titles: IoU, k-NN, CKA, CLS (not "Iou", "K-nn", "Cka", "Cls")."""

from __future__ import annotations

import re

__all__ = ["display_name", "label", "sentence_case", "short_name"]

#: lower-case word -> how it is written
PROPER = {"iou": "IoU", "knn": "k-NN", "k-nn": "k-NN", "cka": "CKA", "cls": "CLS", "nmi": "NMI", "ari": "ARI",
          "pck": "PCK", "mae": "MAE", "sift": "SIFT", "aaam": "AAAM", "davis": "DAVIS", "spair": "SPair",
          "coco": "COCO", "vit": "ViT", "cnn": "CNN", "cnns": "CNNs", "rgb": "RGB", "kk": "KK", "kn": "KN",
          "nk": "NK", "nn": "NN", "j&f": "J&F", "bn": "BN", "attn": "attention", "mlp": "MLP"}


def _proper(text: str) -> str:
    """Every whitespace-separated word that is a proper name (:data:`PROPER`) written as such."""
    out = []
    for word in re.split(r"(\s+)", text.strip()):
        core = word.lower().strip("(),:;")
        if core in PROPER:
            word = word.lower().replace(core, PROPER[core])
        out.append(word)
    return "".join(out)


def label(text: str) -> str:
    """An identifier or phrase as a label, in its own case: underscores as spaces, proper names as written.

    ``"random_cls_iou"`` -> ``"random CLS IoU"``; ``"mAP_medium"`` -> ``"mAP medium"``.
    """
    return _proper(text.replace("_", " "))


def sentence_case(text: str) -> str:
    """First letter upper case, proper names (:data:`PROPER`) as written; the rest as given.

    ``"best-head saliency iou per block"`` -> ``"Best-head saliency IoU per block"``;
    ``"knn accuracy"`` -> ``"k-NN accuracy"`` (k-NN keeps its lower-case k).
    """
    joined = _proper(text)
    if joined and joined[0].islower() and not joined.startswith("k-NN"):
        joined = joined[0].upper() + joined[1:]
    return joined


def display_name(name: str) -> str:
    """An identifier (``saliency_iou``, ``knn_probe@cls``) as a title: ``Saliency IoU``, ``k-NN probe (cls)``."""
    base, _, tag = name.partition("@")
    text = sentence_case(base.replace("_", " "))
    return f"{text} ({tag})" if tag else text


def short_name(text: str, limit: int) -> str:
    """``text`` cut in the middle to ``limit`` characters (long file names under a thumbnail)."""
    return text if len(text) <= limit else text[: limit // 2 - 1] + "..." + text[-(limit - limit // 2 - 2):]
