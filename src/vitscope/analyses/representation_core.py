"""Mergeable HSIC state behind the CKA analyses (METHODS.md section 2).

Two estimators of the CKA between every representation of a group X and every one of a group Y (or of X
with itself), both exactly mergeable:

- :class:`MinibatchHSIC` (Nguyen et al. 2021): images are assigned to minibatch ``index // batch`` by their
  dataset index, so the partition (and hence the estimate) does not depend on how the stream was split
  across batches, workers or resumed runs. A minibatch is reduced to its three unbiased HSICs as soon as
  it is complete; incomplete ones keep their images' features until ``compute`` (then a minibatch of
  fewer than 4 images is dropped). State: HSIC sums weighted by minibatch size, plus the open buffers.
- :class:`FullHSIC`: every image's features go to a disk-backed :class:`RowStore`; ``compute`` builds the
  full Grams chunk by chunk and applies the biased (default) or unbiased estimator.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from vitscope.features.rowstore import RowStore
from vitscope.functional.cka_grams import cka_from_hsic, grams, hsic_matrix

__all__ = ["FullHSIC", "MinibatchHSIC", "chunked_gram"]

_MIN_UNBIASED = 4


def _stack_grams(reps: Sequence[torch.Tensor], gram_minmax: bool) -> torch.Tensor:
    """``[A, b, b]`` Grams of A representations ``[b, F_a]`` (stacked into one product when widths agree)."""
    if len({r.shape[1] for r in reps}) == 1:
        return grams(torch.stack(list(reps)), gram_minmax)  # one float64 conversion, inside grams
    return torch.cat([grams(r.to(torch.float64)[None], gram_minmax) for r in reps])


def _hsic_terms(xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor] | None, gram_minmax: bool,
                unbiased: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(hsic_xy [A, B], hsic_xx [A], hsic_yy [B])`` of one set of examples."""
    kx = _stack_grams(xs, gram_minmax)
    hxx = hsic_matrix(kx, unbiased=unbiased)
    if ys is None:
        return hxx, hxx.diagonal().clone(), hxx.diagonal().clone()
    ky = _stack_grams(ys, gram_minmax)
    hyy = hsic_matrix(ky, unbiased=unbiased).diagonal().clone()
    return hsic_matrix(kx, ky, unbiased=unbiased), hxx.diagonal().clone(), hyy


def chunked_gram(chunks: Sequence[np.ndarray]) -> torch.Tensor:
    """Gram ``X X^T`` (float64) of rows given as consecutive chunks ``[b_i, ...]`` (e.g. memory maps).

    Only two chunks are converted to float64 at a time, so memory is ``n^2`` plus two chunks.
    """
    sizes = [len(c) for c in chunks]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    k = torch.zeros((int(starts[-1]),) * 2, dtype=torch.float64)

    def rows(c: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.array(c, dtype=np.float64).reshape(len(c), -1))

    for i, ci in enumerate(chunks):
        xi = rows(ci)
        for j in range(i, len(chunks)):
            xj = xi if j == i else rows(chunks[j])
            block = xi @ xj.T
            k[starts[i] : starts[i + 1], starts[j] : starts[j + 1]] = block
            k[starts[j] : starts[j + 1], starts[i] : starts[i + 1]] = block.T
    return k


class MinibatchHSIC:
    """Streaming unbiased minibatch HSIC sums for CKA matrices (merge-exact: minibatches by dataset index).

    Args:
        batch: minibatch size (>= 4).
        gram_minmax: min-max rescale every minibatch Gram as the 002 code.
        symmetric: X is compared with itself (``add`` gets no ``ys``).
    """

    def __init__(self, batch: int = 64, gram_minmax: bool = False, symmetric: bool = True) -> None:
        if int(batch) != batch or batch < _MIN_UNBIASED:
            raise ValueError(f"batch must be an integer >= {_MIN_UNBIASED}, got {batch!r}")
        self.batch, self.gram_minmax, self.symmetric = int(batch), bool(gram_minmax), bool(symmetric)
        self.sums: list[torch.Tensor] | None = None  # [xy [A, B], xx [A], yy [B]], weighted by minibatch size
        self.weight = 0  # images in reduced minibatches
        self.count = 0  # images seen
        # minibatch -> chunks (image indices [c], features [c, F] of each rep) not yet reduced
        self.open: dict[int, list[tuple[np.ndarray, list[np.ndarray]]]] = {}
        self.done: set[int] = set()  # minibatches already reduced

    def _reduce(self, chunks: list[tuple[np.ndarray, list[np.ndarray]]]) -> None:
        """Fold one minibatch (its chunks) into the sums, rows sorted by image index."""
        index = np.concatenate([c[0] for c in chunks])
        b = index.size
        if b < _MIN_UNBIASED:
            return
        order = np.argsort(index, kind="stable")
        reps = [torch.from_numpy(np.concatenate([c[1][a] for c in chunks])[order]) for a in range(len(chunks[0][1]))]
        num_x = len(reps) if self.symmetric else len(reps) // 2
        terms = _hsic_terms(reps[:num_x], None if self.symmetric else reps[num_x:], self.gram_minmax, True)
        weighted = [b * t for t in terms]
        self.sums = weighted if self.sums is None else [s + t for s, t in zip(self.sums, weighted)]
        self.weight += b

    def _put(self, mb: int, index: np.ndarray, feats: list[np.ndarray]) -> None:
        """Add the rows of one minibatch; reduce it once it holds ``batch`` images."""
        chunks = self.open.setdefault(mb, [])
        seen = np.concatenate([c[0] for c in chunks] + [index])
        if mb in self.done or np.unique(seen).size != seen.size:
            raise ValueError(f"an image of minibatch {mb} (indices {index.tolist()[:4]}...) was added twice; "
                             "every image needs a distinct dataset index")
        chunks.append((index, feats))
        if seen.size == self.batch:
            self._reduce(self.open.pop(mb))
            self.done.add(mb)

    def add(self, indices: Sequence[int], xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor] | None = None) -> None:
        """Add a batch: ``xs`` (and ``ys`` unless symmetric) are lists of ``[b, F]`` representations."""
        if (ys is None) != self.symmetric:
            raise ValueError("pass ys exactly when the HSIC state is not symmetric")
        index = np.asarray(list(indices), dtype=np.int64)
        reps = [r.detach().float().cpu().numpy() for r in list(xs) + list(ys or [])]
        minibatch = index // self.batch
        for mb in np.unique(minibatch):
            sel = minibatch == mb
            self._put(int(mb), index[sel], [r[sel] for r in reps])
        self.count += index.size

    def merge(self, other: MinibatchHSIC) -> MinibatchHSIC:
        """Fold ``other`` in (``other`` is unchanged); returns ``self``."""
        if (other.batch, other.gram_minmax, other.symmetric) != (self.batch, self.gram_minmax, self.symmetric):
            raise ValueError("cannot merge minibatch HSIC states with different batch / gram_minmax settings")
        if self.done & other.done:
            raise ValueError("both HSIC states hold the same minibatch: the same images were added twice")
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

    def cka(self) -> torch.Tensor | None:
        """``[A, B]`` CKA from every complete minibatch and the open ones with >= 4 images (None if none)."""
        twin = MinibatchHSIC(self.batch, self.gram_minmax, self.symmetric)
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
            raise ValueError("pass ys exactly when the HSIC state is not symmetric")
        self.num_x = len(xs)
        cols = {f"x{a}": x.detach().float() for a, x in enumerate(xs)}
        cols.update({f"y{b}": y.detach().float() for b, y in enumerate(ys or [])})
        cols["index"] = np.asarray(list(indices), dtype=np.int64)
        self.store.append(cols)
        self.count += len(indices)

    def merge(self, other: FullHSIC) -> FullHSIC:
        """Fold ``other`` in (its rows are shared read-only or copied); returns ``self``."""
        if other.symmetric != self.symmetric:
            raise ValueError("cannot merge symmetric and non-symmetric HSIC states")
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
