"""Names as people write them in titles: IoU, k-NN, CKA, CLS (not "Iou", "K-nn", "Cka", "Cls")."""

from __future__ import annotations

import re

__all__ = ["display_name", "sentence_case"]

#: lower-case word -> how it is written
PROPER = {"iou": "IoU", "knn": "k-NN", "k-nn": "k-NN", "cka": "CKA", "cls": "CLS", "nmi": "NMI", "ari": "ARI",
          "pck": "PCK", "mae": "MAE", "sift": "SIFT", "aaam": "AAAM", "davis": "DAVIS", "spair": "SPair",
          "coco": "COCO", "vit": "ViT", "cnn": "CNN", "cnns": "CNNs", "rgb": "RGB", "kk": "KK", "kn": "KN",
          "nk": "NK", "nn": "NN", "j&f": "J&F"}


def sentence_case(text: str) -> str:
    """First letter upper case, proper names (:data:`PROPER`) as written; the rest as given.

    ``"best-head saliency iou per block"`` -> ``"Best-head saliency IoU per block"``;
    ``"knn accuracy"`` -> ``"k-NN accuracy"`` (k-NN keeps its lower-case k).
    """
    words = re.split(r"(\s+)", text.strip())
    out = []
    for word in words:
        core = word.lower().strip("(),:;")
        if core in PROPER:
            word = word.lower().replace(core, PROPER[core])
        out.append(word)
    joined = "".join(out)
    if joined and joined[0].islower() and not joined.startswith("k-NN"):
        joined = joined[0].upper() + joined[1:]
    return joined


def display_name(name: str) -> str:
    """An identifier (``saliency_iou``, ``knn_probe@cls``) as a title: ``Saliency IoU``, ``k-NN probe (cls)``."""
    base, _, tag = name.partition("@")
    text = sentence_case(base.replace("_", " "))
    return f"{text} ({tag})" if tag else text
