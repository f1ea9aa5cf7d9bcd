"""Minibatch CKA over minibatches drawn at random from the data (a seeded hash order of the dataset indices), so
the estimate does not depend on how the data is sorted: class-sorted folders give a within-class CKA when minibatches
are cut in dataset order (:class:`~vitscope.analyses.representation.hsic.MinibatchHSIC`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from vitscope.analyses.representation.hsic import MIN_UNBIASED, FullHSIC, MinibatchHSIC
from vitscope.errors import VitscopeValueError
from vitscope.functional.cka_grams import cross_gram
from vitscope.functional.index_hash import index_hash

__all__ = ["ShuffledHSIC", "shuffled_positions"]


def shuffled_positions(index: np.ndarray, seed: int) -> np.ndarray:
    """Positions of ``index`` in their seeded shuffled order: sorted by :func:`index_hash` of ``(seed, index)``
    (ties, about one in 2**64, by index), so the order of an image among others depends on their indices alone."""
    return np.lexsort((index, index_hash(index, seed)))


def _rows_at(parts: Sequence[tuple[int, np.ndarray]], pos: np.ndarray) -> np.ndarray:
    """Rows ``pos`` (store positions, in that order) of a column given as consecutive chunks ``(start, rows)``."""
    starts = np.asarray([start for start, _ in parts])
    which = np.searchsorted(starts, pos, side="right") - 1
    out = np.empty((pos.size, *parts[0][1].shape[1:]), dtype=parts[0][1].dtype)
    for k in np.unique(which):
        picked = which == k
        out[picked] = parts[k][1][pos[picked] - starts[k]]
    return out


class ShuffledHSIC:
    """Minibatch CKA (Nguyen et al. 2021) over minibatches drawn at random from the dataset rather than cut from it
    in order: the images are ordered by a seeded hash of their dataset index (:func:`shuffled_positions`) and
    minibatch ``k`` is ranks ``k * batch`` to ``(k + 1) * batch - 1`` of that order, the last, smaller one dropped
    under 4 images. A minibatch then holds images from anywhere in the data, so every image's features wait in a
    disk-backed :class:`RowStore` (as :class:`FullHSIC`'s) until :meth:`cka` makes the minibatches. The estimate
    depends on ``batch``, ``seed`` and the images read alone: not on their order, the engine's batches, the
    processes or a resume.

    Args:
        batch: minibatch size (>= 4).
        gram_minmax: min-max rescale every minibatch Gram as the 002 code.
        symmetric: X is compared with itself.
        seed: the shuffle's seed (any integer).
        workdir: folder for spilled rows (None: a temporary folder).
    """

    def __init__(self, batch: int = 64, gram_minmax: bool = False, symmetric: bool = True, seed: int = 0,
                 workdir: str | Path | None = None) -> None:
        if int(batch) != batch or batch < MIN_UNBIASED:
            raise VitscopeValueError(f"batch must be an integer >= {MIN_UNBIASED}, got {batch!r}")
        self.batch, self.gram_minmax, self.seed = int(batch), bool(gram_minmax), int(seed)
        self.rows = FullHSIC(symmetric, workdir)

    @property
    def symmetric(self) -> bool:
        return self.rows.symmetric

    @property
    def count(self) -> int:
        """Images added."""
        return self.rows.count

    def add(self, indices: Sequence[int], xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor] | None = None) -> None:
        """Keep a batch's rows: ``xs`` (and ``ys`` unless symmetric) are lists of ``[b, F]`` representations."""
        self.rows.add(indices, xs, ys)

    def merge(self, other: ShuffledHSIC) -> ShuffledHSIC:
        """Fold ``other`` in (its rows are shared read-only or copied); returns ``self``."""
        if (other.batch, other.gram_minmax, other.seed) != (self.batch, self.gram_minmax, self.seed):
            raise VitscopeValueError("cannot merge shuffled minibatch HSIC states with different batch / gram_minmax "
                                     "/ seed")
        self.rows.merge(other.rows)
        return self

    def cka(self) -> torch.Tensor | None:
        """``[A, B]`` CKA over the shuffled minibatches (None when none holds 4 images)."""
        store = self.rows.store
        if store.rows == 0:
            return None
        order = shuffled_positions(store.column("index"), self.seed)
        num_y = sum(1 for c in store.schema if c.startswith("y"))
        names = [f"x{a}" for a in range(self.rows.num_x)] + [f"y{b}" for b in range(num_y)]
        columns = {}
        for name in names:
            parts, start = [], 0
            for chunk in store.chunks([name], max_rows=max(store.rows, 1)):  # memory maps: rows read on demand
                parts.append((start, chunk[name]))
                start += len(chunk[name])
            columns[name] = parts
        folded = MinibatchHSIC(self.batch, self.gram_minmax, self.symmetric)
        folded.num_x = self.rows.num_x
        for start in range(0, order.size, self.batch):
            pos = order[start : start + self.batch]
            if pos.size >= MIN_UNBIASED:
                folded.fold([cross_gram(_rows_at(columns[name], pos)) for name in names], int(pos.size))
        return folded.cka()
