"""Mergeable HSIC state behind the CKA analyses (docs/methods.md, Representations).

Two estimators of the CKA between every representation of a group X and every one of a group Y (or of X
with itself), both exactly mergeable:

- :class:`MinibatchHSIC` (Nguyen et al. 2021): per minibatch, the three unbiased HSICs of every pair, summed
  weighted by minibatch size. How the stream is cut into minibatches (``grouping``):

  * ``"batch"`` (default): the images of each ``add`` call (one engine batch), sorted by dataset index, are
    cut into consecutive minibatches of ``batch`` images and reduced at once, so no feature outlives its
    batch (as the 002 code, whose minibatch was its loader batch). Memory is flat and small in every case;
    the partition depends on the engine batch size (a batch of 16 gives minibatches of 16) but not on how
    the batches are later merged. With an engine batch size that is a multiple of ``batch`` it is exactly
    the ``"index"`` partition.
  * ``"index"``: image ``i`` belongs to minibatch ``i // batch`` whatever the batch it arrives in, so the
    estimate does not depend on the engine batch size, worker split or resume. The features of a
    minibatch that is not complete yet are kept until it is (up to ``batch - 1`` images when batches
    arrive in order; a minibatch missing an unreadable image is only reduced by ``cka()``).

  Pieces of fewer than 4 images (an engine batch smaller than 4, or its tail) cannot give an unbiased
  HSIC alone: they are pooled by index as ``"index"`` does, so a stream of tiny batches still counts; a
  final pooled minibatch of fewer than 4 images is dropped. Grams are built one representation at a time
  in float64 (two chunks converted at a time), never for every representation at once.
- :class:`FullHSIC`: every image's features go to a disk-backed :class:`RowStore`; ``compute`` builds the
  full Grams chunk by chunk and applies the biased (default) or unbiased estimator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vitscope.errors import VitscopeValueError
from vitscope.features.rowstore import RowStore
from vitscope.functional.cka import _minmax_gram
from vitscope.functional.cka_grams import cka_from_hsic, cross_gram, hsic_matrix

__all__ = ["GROUPINGS", "FullHSIC", "MinibatchHSIC", "PreparedRep", "chunked_gram"]

_MIN_UNBIASED = 4
GROUPINGS = ("batch", "index")


def chunked_gram(chunks: Sequence[np.ndarray | torch.Tensor]) -> torch.Tensor:
    """Gram ``X X^T`` (float64, CPU) of rows given as consecutive chunks ``[b_i, ...]`` (e.g. memory maps).

    Blocks are built by :func:`~vitscope.functional.cka_grams.cross_gram`, a few feature columns converted to
    float64 at a time, so memory is ``n^2`` plus a small working set whatever the feature width.
    """
    sizes = [len(c) for c in chunks]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    k = torch.zeros((int(starts[-1]),) * 2, dtype=torch.float64)
    for i, ci in enumerate(chunks):
        for j in range(i, len(chunks)):
            block = cross_gram(ci, None if j == i else chunks[j]).cpu()
            k[starts[i] : starts[i + 1], starts[j] : starts[j + 1]] = block
            k[starts[j] : starts[j + 1], starts[i] : starts[i + 1]] = block.T
    return k


@dataclass
class PreparedRep:
    """One representation of one batch, reduced for :meth:`MinibatchHSIC.add`: per minibatch of the batch (in
    index order) its Gram ``[m, m]``, or its rows ``[m, F]`` when the minibatch is too small to stand alone."""

    parts: list[torch.Tensor]


class MinibatchHSIC:
    """Streaming unbiased minibatch HSIC sums for CKA matrices (merge-exact; see the module docstring).

    Args:
        batch: minibatch size (>= 4).
        gram_minmax: min-max rescale every minibatch Gram as the 002 code.
        symmetric: X is compared with itself (``add`` gets no ``ys``).
        grouping: ``"batch"`` (minibatches within each added batch, nothing kept) or ``"index"`` (minibatch
            ``index // batch``, independent of the batch sizes).
    """

    def __init__(self, batch: int = 64, gram_minmax: bool = False, symmetric: bool = True,
                 grouping: str = "batch") -> None:
        if int(batch) != batch or batch < _MIN_UNBIASED:
            raise VitscopeValueError(f"batch must be an integer >= {_MIN_UNBIASED}, got {batch!r}")
        if grouping not in GROUPINGS:
            raise VitscopeValueError(f"grouping must be one of {GROUPINGS}, got {grouping!r}")
        self.batch, self.gram_minmax, self.symmetric = int(batch), bool(gram_minmax), bool(symmetric)
        self.grouping = grouping
        self.sums: list[torch.Tensor] | None = None  # [xy [A, B], xx [A], yy [B]], weighted by minibatch size
        self.weight = 0  # images in reduced minibatches
        self.count = 0  # images seen
        # minibatch -> chunks (image indices [c], features [c, F] of each rep) not yet reduced
        self.open: dict[int, list[tuple[np.ndarray, list[np.ndarray]]]] = {}
        self.done: set[int] = set()  # index minibatches already reduced

    def _fold(self, grams: list[torch.Tensor], b: int) -> None:
        """Add the weighted HSIC terms of one minibatch of ``b`` images given every representation's Gram."""
        if self.gram_minmax:
            grams = [_minmax_gram(k) for k in grams]
        num_x = len(grams) if self.symmetric else len(grams) // 2
        kx = torch.stack(grams[:num_x])
        hxx = hsic_matrix(kx, unbiased=True)
        if self.symmetric:
            terms = [hxx, hxx.diagonal().clone(), hxx.diagonal().clone()]
        else:
            ky = torch.stack(grams[num_x:])
            terms = [hsic_matrix(kx, ky, unbiased=True), hxx.diagonal().clone(),
                     hsic_matrix(ky, unbiased=True).diagonal().clone()]
        weighted = [b * t for t in terms]
        self.sums = weighted if self.sums is None else [s + t for s, t in zip(self.sums, weighted)]
        self.weight += b

    def _reduce(self, chunks: list[tuple[np.ndarray, list[np.ndarray]]]) -> None:
        """Fold one index minibatch (its chunks) into the sums, rows sorted by image index."""
        index = np.concatenate([c[0] for c in chunks])
        b = index.size
        if b < _MIN_UNBIASED:
            return
        order = torch.from_numpy(np.argsort(index, kind="stable"))
        grams = []
        for a in range(len(chunks[0][1])):
            k = chunked_gram([c[1][a] for c in chunks])
            grams.append(k[order][:, order])
        self._fold(grams, b)

    def _put(self, mb: int, index: np.ndarray, feats: list[np.ndarray]) -> None:
        """Add the rows of one index minibatch; reduce it once it holds ``batch`` images."""
        chunks = self.open.setdefault(mb, [])
        seen = np.concatenate([c[0] for c in chunks] + [index])
        if mb in self.done or np.unique(seen).size != seen.size:
            raise VitscopeValueError(f"an image of minibatch {mb} (indices {index.tolist()[:4]}...) was added twice; "
                                     "every image needs a distinct dataset index")
        chunks.append((index, feats))
        if seen.size == self.batch:
            self._reduce(self.open.pop(mb))
            self.done.add(mb)

    def _pool(self, index: np.ndarray, reps: Sequence[torch.Tensor]) -> None:
        """Keep rows (copied to the CPU) in their index minibatches until those are complete."""
        feats = [r.detach().float().cpu().reshape(len(index), -1).numpy().copy() for r in reps]
        minibatch = index // self.batch
        for mb in np.unique(minibatch):
            sel = minibatch == mb
            self._put(int(mb), index[sel], [f[sel] for f in feats])

    def _minibatches(self, index: np.ndarray) -> list[np.ndarray]:
        """Positions of each minibatch of one added batch (``"batch"`` grouping), in index order."""
        order = np.argsort(index, kind="stable")
        return [order[start : start + self.batch] for start in range(0, order.size, self.batch)]

    def prepare(self, indices: Sequence[int], rep: torch.Tensor) -> PreparedRep | torch.Tensor:
        """What :meth:`add` needs of one representation ``[b, F]`` of a batch: with ``"batch"`` grouping its
        minibatch Grams (``[m, m]`` each, small) instead of its features, so a caller can let the features go
        as soon as they are made; with ``"index"`` grouping the features themselves."""
        if self.grouping == "index":
            return rep
        index = np.asarray(list(indices), dtype=np.int64)
        return PreparedRep([self._gram_or_rows(rep, pos) for pos in self._minibatches(index)])

    @staticmethod
    def _gram_or_rows(rep: torch.Tensor, pos: np.ndarray) -> torch.Tensor:
        """The minibatch's Gram, or its rows when it is too small to be reduced on its own (pooled)."""
        if pos.size < _MIN_UNBIASED:
            return rep[torch.from_numpy(pos).to(rep.device)]
        if pos[-1] - pos[0] == pos.size - 1:  # consecutive rows (batches arrive sorted): a view, no copy
            picked = rep[int(pos[0]) : int(pos[-1]) + 1]
        else:
            picked = rep[torch.from_numpy(pos).to(rep.device)]
        return cross_gram(picked.detach().float()).cpu()

    def add(self, indices: Sequence[int], xs: Sequence[torch.Tensor | PreparedRep],
            ys: Sequence[torch.Tensor | PreparedRep] | None = None) -> None:
        """Add a batch: ``xs`` (and ``ys`` unless symmetric) are lists of ``[b, F]`` representations, or what
        :meth:`prepare` made of them."""
        if (ys is None) != self.symmetric:
            raise VitscopeValueError("pass ys exactly when the HSIC state is not symmetric")
        index = np.asarray(list(indices), dtype=np.int64)
        reps = list(xs) + list(ys or [])
        if self.grouping == "index":
            self._pool(index, reps)
        else:
            prepared = [r if isinstance(r, PreparedRep) else self.prepare(indices, r) for r in reps]
            for m, pos in enumerate(self._minibatches(index)):
                parts = [p.parts[m] for p in prepared]
                if pos.size < _MIN_UNBIASED:
                    self._pool(index[pos], parts)
                else:
                    self._fold(parts, int(pos.size))
        self.count += index.size

    def merge(self, other: MinibatchHSIC) -> MinibatchHSIC:
        """Fold ``other`` in (``other`` is unchanged); returns ``self``."""
        mine = (self.batch, self.gram_minmax, self.symmetric, self.grouping)
        if (other.batch, other.gram_minmax, other.symmetric, other.grouping) != mine:
            raise VitscopeValueError("cannot merge minibatch HSIC states with different batch / gram_minmax / grouping")
        if self.done & other.done:
            raise VitscopeValueError("both HSIC states hold the same minibatch: the same images were added twice")
        self.done |= other.done
        if other.sums is not None:
            self.sums = [s.clone() for s in other.sums] if self.sums is None else [
                s + t for s, t in zip(self.sums, other.sums)]
        self.weight += other.weight
        self.count += other.count
        for mb, chunks in other.open.items():
            for index, feats in chunks:
                self._put(mb, index.copy(), [f.copy() for f in feats])
        return self

    def held_bytes(self) -> int:
        """Bytes of features kept for minibatches that are not complete yet."""
        return sum(f.nbytes for chunks in self.open.values() for _, feats in chunks for f in feats)

    def cka(self) -> torch.Tensor | None:
        """``[A, B]`` CKA from every reduced minibatch and the open ones with >= 4 images (None if none)."""
        twin = MinibatchHSIC(self.batch, self.gram_minmax, self.symmetric, self.grouping)
        twin.sums = None if self.sums is None else [s.clone() for s in self.sums]
        twin.weight = self.weight
        for mb in sorted(self.open):
            twin._reduce(self.open[mb])
        if twin.sums is None:
            return None
        xy, xx, yy = (s / twin.weight for s in twin.sums)
        return cka_from_hsic(xy, xx, yy)


class FullHSIC:
    """Full-batch CKA from every image's features kept in a disk-backed :class:`RowStore`.

    Args:
        symmetric: X is compared with itself.
        workdir: folder for spilled rows (None: a temporary folder).
    """

    def __init__(self, symmetric: bool = True, workdir: str | Path | None = None) -> None:
        self.symmetric = bool(symmetric)
        self.store = RowStore(workdir=workdir)
        self.num_x = 0
        self.count = 0

    def add(self, indices: Sequence[int], xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor] | None = None) -> None:
        if (ys is None) != self.symmetric:
            raise VitscopeValueError("pass ys exactly when the HSIC state is not symmetric")
        self.num_x = len(xs)
        cols = {f"x{a}": x.detach().float() for a, x in enumerate(xs)}
        cols.update({f"y{b}": y.detach().float() for b, y in enumerate(ys or [])})
        cols["index"] = np.asarray(list(indices), dtype=np.int64)
        self.store.append(cols)
        self.count += len(indices)

    def merge(self, other: FullHSIC) -> FullHSIC:
        """Fold ``other`` in (its rows are shared read-only or copied); returns ``self``."""
        if other.symmetric != self.symmetric:
            raise VitscopeValueError("cannot merge symmetric and non-symmetric HSIC states")
        self.store.extend(other.store)
        self.num_x = self.num_x or other.num_x
        self.count += other.count
        return self

    def _gram(self, name: str, max_rows: int = 2048) -> torch.Tensor:
        """``[n, n]`` float64 Gram of one column in store order."""
        return chunked_gram([c[name] for c in self.store.chunks([name], max_rows)])

    def cka(self, unbiased: bool = False) -> torch.Tensor | None:
        """``[A, B]`` full-batch CKA (CKA does not depend on the order of the examples); None if too few."""
        n = self.store.rows
        if n < (_MIN_UNBIASED if unbiased else 2):
            return None
        kx = torch.stack([self._gram(f"x{a}") for a in range(self.num_x)])
        hxx = hsic_matrix(kx, unbiased=unbiased)
        if self.symmetric:
            return cka_from_hsic(hxx, hxx.diagonal(), hxx.diagonal())
        num_y = sum(1 for c in self.store.schema if c.startswith("y"))
        ky = torch.stack([self._gram(f"y{b}") for b in range(num_y)])
        hyy = hsic_matrix(ky, unbiased=unbiased).diagonal()
        return cka_from_hsic(hsic_matrix(kx, ky, unbiased=unbiased), hxx.diagonal(), hyy)
