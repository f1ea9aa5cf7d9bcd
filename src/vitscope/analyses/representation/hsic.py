"""Mergeable HSIC state behind the CKA analyses (docs/methods.md, Representations).

Two estimators of the CKA between every representation of a group X and every one of a group Y (or of X
with itself), both exactly mergeable and independent of how the images were batched:

- :class:`MinibatchHSIC` (Nguyen et al. 2021): per minibatch, the three unbiased HSICs of every pair, summed
  weighted by minibatch size. Image ``i`` belongs to minibatch ``i // batch`` (its dataset index), whatever
  engine batch, process or resumed run it arrives in, so the estimate depends on the minibatch size only.
  A batch that holds a whole minibatch reduces it at once to its Grams (``[m, m]``, float64). The rows of
  a minibatch that arrives in pieces wait in small disk-backed row stores (in memory up to 1 MiB a piece,
  then on disk), one per piece and representation, until the minibatch is complete; then its Grams are
  built from them and the files deleted. So what waits is on disk, not in memory, and a smaller engine batch
  costs no more memory than a larger one; the disk holds at most the rows of the minibatches still open
  (up to ``batch - 1`` images of every representation in one process, plus the two minibatches a process's
  share of the data may start and end inside). Minibatches still open at the end (the last, smaller one) are
  reduced by :meth:`MinibatchHSIC.cka` when they hold at least 4 images, dropped otherwise.
- :class:`FullHSIC`: every image's features go to a disk-backed :class:`RowStore`; ``compute`` builds the
  full Grams chunk by chunk and applies the biased (default) or unbiased estimator.

Minibatches drawn at random from the data rather than cut from it in order are
:class:`~vitscope.analyses.representation.shuffled_hsic.ShuffledHSIC`'s.

Grams are built one representation at a time in float64 (two chunks converted at a time), never for every
representation at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from vitscope.cache.rowstore import RowStore
from vitscope.errors import VitscopeValueError
from vitscope.functional.cka import _minmax_gram
from vitscope.functional.cka_grams import cka_from_hsic, cross_gram, hsic_matrix

__all__ = ["MIN_UNBIASED", "FullHSIC", "MinibatchHSIC", "PreparedRep", "chunked_gram"]

MIN_UNBIASED = 4
#: bytes of one waiting piece kept in memory; larger pieces go to disk at once
_PIECE_IN_MEMORY = 1 << 20


def chunked_gram(chunks: Sequence[np.ndarray | torch.Tensor]) -> torch.Tensor:
    """Gram ``X X^T`` (float64) of rows given as consecutive chunks ``[b_i, ...]`` (e.g. memory maps).

    Blocks are built by :func:`~vitscope.functional.cka_grams.cross_gram`, a few feature columns converted to
    float64 at a time, so memory is ``n^2`` plus a small working set whatever the feature width. The Gram is
    made on the device of the first tensor among the chunks (host rows are copied there block by block), on the
    CPU when every chunk is a numpy array.
    """
    sizes = [len(c) for c in chunks]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    device = next((c.device for c in chunks if isinstance(c, torch.Tensor)), torch.device("cpu"))
    k = torch.zeros((int(starts[-1]),) * 2, dtype=torch.float64, device=device)
    for i, ci in enumerate(chunks):
        for j in range(i, len(chunks)):
            block = cross_gram(ci, None if j == i else chunks[j], device=device)
            k[starts[i] : starts[i + 1], starts[j] : starts[j + 1]] = block
            k[starts[j] : starts[j + 1], starts[i] : starts[i + 1]] = block.T
    return k


@dataclass
class PreparedRep:
    """One representation of one batch, reduced for :meth:`MinibatchHSIC.add`: for each minibatch the batch
    touches (in minibatch order), its Gram ``[m, m]`` when the batch holds the whole minibatch, else its rows
    ``[m, F]`` in a row store (on disk when large) to wait for the rest."""

    parts: list[torch.Tensor | RowStore]


@dataclass
class LastPiece:
    """The rows ``[m, F]`` (on the batch's device) of the piece that completes a minibatch: reduced at once with
    the waiting pieces, so it is never copied to the host."""

    rows: torch.Tensor


@dataclass
class OpenMinibatch:
    """The pieces of one minibatch received so far: their image indices and, per representation, their rows."""

    index: list[np.ndarray] = field(default_factory=list)
    rows: list[list[RowStore]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return int(sum(i.size for i in self.index))


def _rows_store(rows: torch.Tensor | np.ndarray) -> RowStore:
    """A private row store holding ``rows`` ``[m, F]`` as float32 (written to disk when over 1 MiB; a device
    tensor is copied to the host without waiting for the device)."""
    store = RowStore(spill_bytes=_PIECE_IN_MEMORY)
    if isinstance(rows, torch.Tensor):
        store.append({"x": rows.detach().reshape(len(rows), -1).float()})
    else:
        store.append({"x": np.asarray(rows, dtype=np.float32)})
    return store


def _copied(store: RowStore) -> RowStore:
    """A private copy of a waiting piece (its own files, which it may delete)."""
    out = RowStore(spill_bytes=_PIECE_IN_MEMORY)
    for chunk in store.chunks(["x"]):
        out.append({"x": np.array(chunk["x"])})
    return out


class MinibatchHSIC:
    """Streaming unbiased minibatch HSIC sums for CKA matrices (merge-exact; see the module docstring).

    Args:
        batch: minibatch size (>= 4): image ``i`` is in minibatch ``i // batch``.
        gram_minmax: min-max rescale every minibatch Gram as the 002 code.
        symmetric: X is compared with itself (``add`` gets no ``ys``).
    """

    #: X representations of a non-symmetric state, set by the first add (a class default: a state saved before it
    #: was kept decodes without it)
    num_x: int | None = None

    def __init__(self, batch: int = 64, gram_minmax: bool = False, symmetric: bool = True) -> None:
        if int(batch) != batch or batch < MIN_UNBIASED:
            raise VitscopeValueError(f"batch must be an integer >= {MIN_UNBIASED}, got {batch!r}")
        self.batch, self.gram_minmax, self.symmetric = int(batch), bool(gram_minmax), bool(symmetric)
        self.sums: list[torch.Tensor] | None = None  # [xy [A, B], xx [A], yy [B]], weighted by minibatch size
        self.weight = 0  # images in reduced minibatches
        self.count = 0  # images seen
        self.open: dict[int, OpenMinibatch] = {}  # minibatches not complete yet
        self.done: set[int] = set()  # minibatches already reduced

    def fold(self, grams: list[torch.Tensor], b: int) -> None:
        """Add the weighted HSIC terms of one minibatch of ``b`` images given every representation's Gram (the
        :attr:`num_x` X representations first, then the Y ones)."""
        if self.gram_minmax:
            grams = [_minmax_gram(k) for k in grams]
        # a state saved before the count was kept compared groups of one size
        num_x = len(grams) if self.symmetric else (self.num_x if self.num_x is not None else len(grams) // 2)
        if not self.symmetric and not 0 < num_x < len(grams):
            raise VitscopeValueError(f"{len(grams)} Grams for {num_x} X representations: a non-symmetric HSIC state "
                                     "needs both X and Y")
        kx = torch.stack(grams[:num_x])
        hxx = hsic_matrix(kx, unbiased=True)
        if self.symmetric:
            terms = [hxx, hxx.diagonal().clone(), hxx.diagonal().clone()]
        else:
            ky = torch.stack(grams[num_x:])
            terms = [hsic_matrix(kx, ky, unbiased=True), hxx.diagonal().clone(),
                     hsic_matrix(ky, unbiased=True).diagonal().clone()]
        weighted = [b * t for t in terms]
        self.sums = weighted if self.sums is None else [s.to(t.device) + t for s, t in zip(self.sums, weighted)]
        self.weight += b

    def _reduce(self, waiting: OpenMinibatch) -> None:
        """Fold one minibatch from its waiting pieces (rows sorted by image index); fewer than 4 images: nothing."""
        index = np.concatenate(waiting.index)
        if index.size < MIN_UNBIASED:
            return
        order = torch.from_numpy(np.argsort(index, kind="stable"))
        grams = []
        for pieces in waiting.rows:
            k = chunked_gram([c for piece in pieces for c in _chunks(piece)])
            grams.append(k[order.to(k.device)][:, order.to(k.device)])
        self.fold(grams, int(index.size))

    def _put(self, mb: int, index: np.ndarray, pieces: list[RowStore | LastPiece]) -> None:
        """Add one piece of minibatch ``mb``; reduce the minibatch (and delete its rows) once it is complete."""
        waiting = self.open.setdefault(mb, OpenMinibatch(rows=[[] for _ in pieces]))
        seen = np.concatenate([*waiting.index, index])
        if mb in self.done or np.unique(seen).size != seen.size:
            raise VitscopeValueError(f"an image of minibatch {mb} (indices {index.tolist()[:4]}...) was added twice; "
                                     "every image needs a distinct dataset index")
        waiting.index.append(index)
        for rows, piece in zip(waiting.rows, pieces):
            rows.append(piece)
        if seen.size == self.batch:
            self._reduce(self.open.pop(mb))
            self.done.add(mb)
            for piece in (p for rows in waiting.rows for p in rows if isinstance(p, RowStore)):
                piece.release()

    def _minibatches(self, index: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """``(minibatch, positions in index order)`` of every minibatch a batch touches, in minibatch order."""
        order = np.argsort(index, kind="stable")
        minibatch = index[order] // self.batch
        cuts = np.flatnonzero(np.diff(minibatch)) + 1
        return [(int(minibatch[part[0]]), order[part]) for part in np.split(np.arange(order.size), cuts)
                if part.size]

    def prepare(self, indices: Sequence[int], rep: torch.Tensor) -> PreparedRep:
        """What :meth:`add` needs of one representation ``[b, F]`` of a batch, so a caller can let the features
        go as soon as they are made: the Gram of every minibatch the batch holds whole (on the batch's device),
        the rows of the piece that completes a minibatch, and those of the others (in a row store, on disk when
        large)."""
        index = np.asarray(list(indices), dtype=np.int64)
        rep = rep.detach().reshape(len(index), -1)
        parts: list[torch.Tensor | RowStore | LastPiece] = []
        for mb, pos in self._minibatches(index):
            picked = _picked(rep, pos)
            if pos.size == self.batch:
                parts.append(cross_gram(picked.float()))
            elif mb in self.open and self.open[mb].size + pos.size == self.batch:
                parts.append(LastPiece(picked.float().clone()))  # a copy: a view would keep the whole batch alive
            else:
                parts.append(_rows_store(picked))
        return PreparedRep(parts)

    def add(self, indices: Sequence[int], xs: Sequence[torch.Tensor | PreparedRep],
            ys: Sequence[torch.Tensor | PreparedRep] | None = None) -> None:
        """Add a batch: ``xs`` (and ``ys`` unless symmetric) are lists of ``[b, F]`` representations, or what
        :meth:`prepare` made of them."""
        if (ys is None) != self.symmetric:
            raise VitscopeValueError("pass ys exactly when the HSIC state is not symmetric")
        self._count_x(len(xs))
        index = np.asarray(list(indices), dtype=np.int64)
        reps = [r if isinstance(r, PreparedRep) else self.prepare(index, r) for r in [*xs, *(ys or [])]]
        for k, (mb, pos) in enumerate(self._minibatches(index)):
            parts = [r.parts[k] for r in reps]
            if isinstance(parts[0], torch.Tensor):  # the whole minibatch is in this batch
                if mb in self.done or mb in self.open:
                    raise VitscopeValueError(f"minibatch {mb} was added twice; every image needs a distinct "
                                             "dataset index")
                self.fold(parts, int(pos.size))
                self.done.add(mb)
            else:
                self._put(mb, index[pos], parts)
        self.count += index.size

    def _count_x(self, num_x: int | None) -> None:
        """Record how many X representations every batch brings (X and Y may differ in number)."""
        if num_x is None or self.symmetric:
            return
        if self.num_x is not None and self.num_x != num_x:
            raise VitscopeValueError(f"{num_x} X representations after {self.num_x}: every batch needs the same ones")
        self.num_x = num_x

    def merge(self, other: MinibatchHSIC) -> MinibatchHSIC:
        """Fold ``other`` in (``other`` is unchanged: its waiting rows are copied); returns ``self``."""
        if (other.batch, other.gram_minmax, other.symmetric) != (self.batch, self.gram_minmax, self.symmetric):
            raise VitscopeValueError("cannot merge minibatch HSIC states with different batch / gram_minmax")
        self._count_x(other.num_x)
        if self.done & (other.done | set(other.open)) or set(self.open) & other.done:
            raise VitscopeValueError("both HSIC states hold the same minibatch: the same images were added twice")
        self.done |= other.done
        if other.sums is not None:
            self.sums = [s.clone() for s in other.sums] if self.sums is None else [
                s + t for s, t in zip(self.sums, other.sums)]
        self.weight += other.weight
        self.count += other.count
        for mb, waiting in other.open.items():
            for k, index in enumerate(waiting.index):
                self._put(mb, index.copy(), [_copied(rows[k]) for rows in waiting.rows])
        return self

    def to_device(self, device: torch.device | str) -> MinibatchHSIC:
        """Move the HSIC sums to ``device`` (the engine brings states to the host after the pass); returns self."""
        if self.sums is not None:
            self.sums = [s.to(device) for s in self.sums]
        return self

    def waiting_images(self) -> int:
        """Images of minibatches that are not complete yet (their rows wait in row stores)."""
        return sum(w.size for w in self.open.values())

    def held_bytes(self) -> int:
        """Bytes of waiting rows held in memory (the rest of them is on disk)."""
        return sum(piece.memory_bytes for w in self.open.values() for rows in w.rows for piece in rows)

    def cka(self) -> torch.Tensor | None:
        """``[A, B]`` CKA from every reduced minibatch and the open ones with >= 4 images (None if none)."""
        twin = MinibatchHSIC(self.batch, self.gram_minmax, self.symmetric)
        twin.num_x = self.num_x
        twin.sums = None if self.sums is None else [s.clone() for s in self.sums]
        twin.weight = self.weight
        for mb in sorted(self.open):
            twin._reduce(self.open[mb])
        if twin.sums is None:
            return None
        xy, xx, yy = (s / twin.weight for s in twin.sums)
        return cka_from_hsic(xy, xx, yy)


def _chunks(piece: RowStore | LastPiece) -> list[np.ndarray | torch.Tensor]:
    """The rows of a waiting piece, as chunks ``[m_i, F]``."""
    if isinstance(piece, LastPiece):
        return [piece.rows]
    return [c["x"] for c in piece.chunks(["x"])]


def _picked(rep: torch.Tensor, pos: np.ndarray) -> torch.Tensor:
    """Rows ``pos`` of ``rep``: a view when they are consecutive (batches arrive sorted), else a copy."""
    if bool((np.diff(pos) == 1).all()):
        return rep[int(pos[0]) : int(pos[-1]) + 1]
    return rep[torch.from_numpy(pos).to(rep.device)]


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
        if n < (MIN_UNBIASED if unbiased else 2):
            return None
        kx = torch.stack([self._gram(f"x{a}") for a in range(self.num_x)])
        hxx = hsic_matrix(kx, unbiased=unbiased)
        if self.symmetric:
            return cka_from_hsic(hxx, hxx.diagonal(), hxx.diagonal())
        num_y = sum(1 for c in self.store.schema if c.startswith("y"))
        ky = torch.stack([self._gram(f"y{b}") for b in range(num_y)])
        hyy = hsic_matrix(ky, unbiased=unbiased).diagonal()
        return cka_from_hsic(hsic_matrix(kx, ky, unbiased=unbiased), hxx.diagonal(), hyy)
