"""The papers vitscope reproduces, as figure captions cite them ("paper 002, fig. 4").

The report lists the ones its page cites under "References", each badge linking there; the README lists all
four. Plain text only: the page links nowhere outside itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["PAPERS", "cited", "paper_number"]

#: paper number -> citation
PAPERS: dict[str, str] = {
    "000": "S. Black, A. Stylianou, R. Pless, R. Souvenir. Visualizing Paired Image Similarity in Transformer "
           "Networks. WACV 2022.",
    "001": "A. Ghiasi, H. Kazemi, E. Borgnia, S. Reich, M. Shu, M. Goldblum, A. G. Wilson, T. Goldstein. What do "
           "Vision Transformers Learn? A Visual Exploration. arXiv:2212.06727, 2022.",
    "002": "M. Walmer, S. Suri, K. Gupta, A. Shrivastava. Teaching Matters: Investigating the Role of Supervision "
           "in Vision Transformers. CVPR 2023 (arXiv:2212.03862).",
    "003": "L. Wu et al. Demystify Self-Attention in Vision Transformers from a Semantic Perspective: Analysis and "
           "Application. arXiv:2211.08543, 2022.",
}

_CITE = re.compile(r"\bpapers? (\d{3})")


def paper_number(text: str) -> str:
    """``"002"`` of ``"paper 002, fig. 4"``; "" when the text cites no paper this list knows (a badge then
    links nowhere)."""
    found = _CITE.search(text or "")
    return found.group(1) if found and found.group(1) in PAPERS else ""


def cited(texts: Iterable[str]) -> list[tuple[str, str]]:
    """``(number, citation)`` of every known paper the texts cite ("paper 002, fig. 4"), in number order."""
    found = {m.group(1) for text in texts if text for m in _CITE.finditer(text)}
    return [(n, PAPERS[n]) for n in sorted(found) if n in PAPERS]
