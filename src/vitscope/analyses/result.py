"""What an analysis returns: a :class:`Result` (named tensors and metadata) that knows its JSON summary, its
tables, its large arrays and its :class:`Figure` objects, each carrying the caption the report shows and the
paper figure it reproduces. :mod:`vitscope.outputs` writes them; the report renders them.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, KeysView, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from vitscope.atomic import atomic_path, write_text_atomic
from vitscope.errors import VitscopeKeyError, VitscopeTypeError, VitscopeValueError
from vitscope.strict_json import dumps
from vitscope.viz.labels import display_name, sentence_case

if TYPE_CHECKING:
    from vitscope.viz.charts import Chart

__all__ = ["DIMS_KEY", "LABELS", "SMALL", "ExplorerMaps", "Figure", "Result", "SummaryResult", "as_result",
           "png_path"]

#: tensors with at most this many elements go to results.json and the CSV tables; larger ones to ``.npz``
SMALL = 4096


def png_path(stem: Path) -> Path:
    """``<stem>.png`` (appended, not substituted: stems may hold dots, e.g. ``keypoints_PCK_at_0.1``)."""
    return stem.parent / f"{stem.name}.png"


#: tensors a result holds only to draw on (uint8 input pictures), never written to arrays/
DRAWING_ONLY = frozenset({"images"})


def stored_arrays(arrays: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The numpy arrays written to ``.npz``: float64 stored as float32, everything else as is.

    States accumulate in float64 so long sums stay exact; a stored array is read, plotted or compared, where
    float32 (7 digits) is plenty and halves the largest files. results.json and the tables keep float64.
    """
    return {k: (t.detach().cpu().float() if t.dtype == torch.float64 else t.detach().cpu()).numpy()
            for k, t in arrays.items()}


def save_arrays(path: str | Path, arrays: Mapping[str, torch.Tensor]) -> None:
    """Write ``arrays`` (:func:`stored_arrays`) to a compressed ``.npz`` (``numpy.load`` reads it as any other).

    Deflate takes 20-30 % off attention maps and most of the index arrays, for about a second per 20 MB.
    """
    import numpy as np

    np.savez_compressed(path, **stored_arrays(arrays))

@dataclass
class Figure:
    """One figure of a result: how to draw it, and the text beside it in the report.

    Attributes:
        stem: file stem (``figures/<stem>.png`` and ``.svg``).
        draw: ``draw(path_without_suffix) -> written files`` (matplotlib is imported only when drawing).
        title: short title.
        caption: what the figure shows and how to read it (required: the report shows it).
        paper: the paper figure it reproduces (e.g. ``"paper 002, fig. 4"``), or "".
        chart: the figure's numbers for the browser (:class:`vitscope.viz.charts.Chart`), or None. A figure
            with a chart is shown interactively in the report and written as ``charts/<stem>.json``; ``draw``
            then runs only when files are asked for (``--figure-files``).
    """

    stem: str
    draw: Callable[[Path], list[Path]]
    title: str
    caption: str
    paper: str = ""
    chart: Chart | None = None

    def __post_init__(self) -> None:
        if not self.stem or any(c in self.stem for c in "/\\"):
            raise VitscopeValueError(f"figure stem {self.stem!r} must be a non-empty file name without '/' or '\\'")


@dataclass(frozen=True)
class ExplorerMaps:
    """What the report's block x head explorer shows of a result (:meth:`Result.explorer_maps`).

    Attributes:
        mean_map: ``[L, H, h, w]`` dataset-average map of every block and head.
        what: what the maps are (``"CLS attention"``), in the explorer's title.
        blocks: block number of each row (None: ``0..L-1``).
        image_maps: ``[I, L, H, h, w]`` maps of single images, or None.
        images: ``[I, H_px, W_px, 3]`` uint8 pictures the single-image maps are drawn over, or None.
        image_names: button text of each single image.
        caption, paper: the text under the explorer and the paper figure it reproduces.
        figure_stems: stems of the result's figures the explorer shows again, the dataset mean's first and then one
            per single image: the report links their files instead of repeating them.
    """

    mean_map: torch.Tensor
    what: str
    blocks: list[int] | None = None
    image_maps: torch.Tensor | None = None
    images: torch.Tensor | None = None
    image_names: list[str] = field(default_factory=list)
    caption: str = ""
    paper: str = ""
    figure_stems: tuple[str, ...] = ()


#: metadata key of a result's own dimension names, ``{tensor key: [name, ...]}`` (before the class's ``DIMS``)
DIMS_KEY = "dims"
#: dimension name -> metadata list naming its positions, used when its length matches (block numbers when an
#: analysis ran on some blocks, the dataset indices of chosen images, masking conditions...); else 0, 1, ...
LABELS: dict[str, str] = {"block": "blocks", "skip_block": "blocks", "branch_block": "blocks", "block_i": "blocks",
                          "block_j": "blocks", "image": "image_indices", "condition": "conditions", "top_k": "topk",
                          "kind": "kinds", "fraction": "fractions", "order": "orders", "ratio": "ratios"}


def _long_table(result: Result, keys: list[str]):
    """One row per element of the tensors ``keys``: ``quantity``, a column per dimension name (integer labels,
    empty where a quantity has no such dimension), ``value``."""
    import pandas as pd

    frames = []
    for key in keys:
        arr = result.tensors[key].detach().cpu().double()
        names, labels = result.dims(key), result.dim_labels(key)
        grid = pd.MultiIndex.from_product(labels, names=names).to_frame(index=False) if names else \
            pd.DataFrame(index=[0])
        frames.append(pd.DataFrame({"quantity": key, **{n: grid[n].to_numpy() for n in names},
                                    "value": arr.reshape(-1).numpy()}))
    if not frames:
        return pd.DataFrame()
    table = pd.concat(frames, ignore_index=True)
    dims = [c for c in table.columns if c not in ("quantity", "value")]
    for c in dims:  # a quantity without the dimension leaves a gap: keep integer labels integers
        if pd.api.types.is_float_dtype(table[c]) and table[c].dropna().mod(1).eq(0).all():
            table[c] = table[c].astype("Int64")
    return table[["quantity", *dims, "value"]]


@dataclass
class Result:
    """Output of ``Analysis.compute()``: named tensors plus metadata, typed by subclass.

    Attributes:
        name: the analysis's name (its instance label, e.g. ``cka@cls``).
        tensors: named tensors (``result["cka"]``).
        meta: JSON-able metadata (model, blocks, settings...).
        intro: the paragraph the report shows above the result (the analysis's description).
    """

    name: str
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any] = field(default_factory=dict)
    intro: str = ""

    #: what each dimension of a tensor is, by key pattern (``fnmatch``, the first match wins), e.g.
    #: ``{"*_iou": ("block", "head")}``; a key without a declaration has ``dim0, dim1, ...``
    DIMS: ClassVar[dict[str, tuple[str, ...]]] = {}

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def __contains__(self, key: object) -> bool:
        """Whether ``result[key]`` is a tensor of this result (``"block_mean" in result``)."""
        return key in self.tensors

    def keys(self) -> KeysView[str]:
        """The names of the tensors (``result[name]``)."""
        return self.tensors.keys()

    def dims(self, key: str) -> tuple[str, ...]:
        """The names of the dimensions of tensor ``key`` (``("block", "head")``): the result's own
        ``meta["dims"]``, else the class's :attr:`DIMS`, else ``dim0, dim1, ...`` (also when a declaration does
        not fit the tensor's number of dimensions or repeats a name)."""
        ndim = self._tensor(key).dim()
        own = self.meta.get(DIMS_KEY, {})
        declared = own.get(key) if isinstance(own, Mapping) and key in own else next(
            (names for pattern, names in self.DIMS.items() if fnmatch.fnmatchcase(key, pattern)), None)
        if declared is not None and len(declared) == ndim and len(set(declared)) == ndim:
            return tuple(str(n) for n in declared)
        return tuple(f"dim{d}" for d in range(ndim))

    def dim_labels(self, key: str) -> list[list[Any]]:
        """The labels of every position of tensor ``key``, one list per dimension: the metadata list
        :data:`LABELS` names for the dimension when its length fits (block numbers...), else ``0 .. n-1``."""
        t = self._tensor(key)
        out = []
        for name, size in zip(self.dims(key), t.shape):
            given = self.meta.get(LABELS.get(name, ""))
            if isinstance(given, torch.Tensor):
                given = given.tolist()
            if isinstance(given, (list, tuple)) and len(given) == size and all(
                    isinstance(v, (int, float, str)) for v in given):
                out.append(list(given))
            else:
                out.append(list(range(size)))
        return out

    def _tensor(self, key: str) -> torch.Tensor:
        if key not in self.tensors:
            raise VitscopeKeyError(f"{self.name!r} has no tensor {key!r}; it has: {', '.join(self.tensors) or 'none'}")
        return self.tensors[key]

    @property
    def base_name(self) -> str:
        """The registered analysis name (without an ``@tag`` instance label)."""
        return self.name.partition("@")[0]

    # ------------------------------------------------------------ numbers

    def to_json(self) -> dict[str, Any]:
        """The results.json entry: metadata plus small tensors as nested lists (large ones as shape and mean,
        their values in :meth:`arrays`)."""
        out: dict[str, Any] = dict(self.meta)
        for key, t in self.tensors.items():
            if t.numel() <= SMALL:
                out[key] = t.detach().cpu().tolist()
            else:
                out[key] = {"shape": list(t.shape), "mean": float(t.double().mean())}
        return out

    def to_frame(self, key: str | None = None):
        """A pandas frame whose axes say what each dimension is, labelled by integers (or by the labels the
        metadata gives, see :meth:`dim_labels`).

        Args:
            key: one tensor: ``[L, H]`` gives index ``block``, columns ``head``; ``[L]`` one column ``key`` over the
                index ``block``; more dimensions put all but the last in the index (a MultiIndex); a 0-dim tensor
                is one row. None: every small tensor in one long table (one row per element: ``quantity``, one
                column per dimension name, ``value``), as ``tables/<name>.csv`` is written.
        """
        if key is None:
            return _long_table(self, [k for k, t in self.tensors.items() if t.numel() <= SMALL])
        import pandas as pd

        t = self._tensor(key).detach().cpu()
        arr = (t.double() if t.is_floating_point() else t).numpy()
        names, labels = self.dims(key), self.dim_labels(key)
        if arr.ndim == 0:
            return pd.DataFrame({key: [arr.item()]})
        if arr.ndim == 1:
            return pd.DataFrame({key: arr}, index=pd.Index(labels[0], name=names[0]))
        index = pd.Index(labels[0], name=names[0]) if arr.ndim == 2 else \
            pd.MultiIndex.from_product(labels[:-1], names=names[:-1])
        return pd.DataFrame(arr.reshape(-1, arr.shape[-1]), index=index,
                            columns=pd.Index(labels[-1], name=names[-1]))

    def tables(self) -> dict[str, Any]:
        """CSV tables a person reads: ``{file stem: pandas DataFrame}`` (the base: the long table)."""
        return {self.name: self.to_frame()}

    def arrays(self) -> dict[str, torch.Tensor]:
        """The tensors too large for results.json and CSV (written once, to ``<name>.npz``), less the
        ``images`` a result keeps to draw its figures on (the input pictures: the figures show them)."""
        return {k: t for k, t in self.tensors.items() if t.numel() > SMALL and k not in DRAWING_ONLY}

    # ------------------------------------------------------------ figures

    def _repr_html_(self) -> str:
        """The result as a card in Jupyter: its title, paragraph, figures and tables, as the report shows them."""
        from vitscope.viz.notebook import card_html

        return card_html(display_name(self.name), self.intro, self.tables(), self.figures())

    def figures(self) -> list[Figure]:
        """The figures of this result (none for the base class)."""
        return []

    def explorer_maps(self) -> ExplorerMaps | None:
        """The block x head maps the report shows in an interactive explorer, or None (the base class: no
        explorer). A result declares the capability by returning them; the report asks every result."""
        return None

    def figure(self, suffix: str, draw: Callable[[Path], list[Path]], caption: str, paper: str = "",
               title: str | None = None, chart: Chart | None = None) -> Figure:
        """A :class:`Figure` of this result with stem ``<name><suffix>``."""
        stem = f"{self.name}{suffix}"
        return Figure(stem, draw, title or sentence_case(stem.replace("_", " ").replace("@", " @")), caption,
                      paper, chart)

    def heatmap_figure(self, suffix: str, matrix: torch.Tensor, title: str, unit: str, caption: str,
                       paper: str = "", block_labels: list | None = None, x_label: str = "head",
                       y_label: str = "block", quantity: str | None = None) -> Figure:
        """A rows x columns heat map of ``matrix`` ``[L, H]`` (blocks x heads by default): a chart in the report,
        :func:`~vitscope.viz.heatmaps.block_head_heatmap` for files. ``quantity`` (a key such as ``"cls_iou"``):
        a bounded quantity is coloured on its documented range (:func:`vitscope.viz.ranges.quantity_range`)."""
        from vitscope.viz.charts import block_head_chart
        from vitscope.viz.ranges import quantity_range

        bounds = quantity_range(quantity) if quantity else None

        def draw(path: Path) -> list[Path]:
            from vitscope.viz.heatmaps import block_head_heatmap

            return block_head_heatmap(matrix, title, unit, path, block_labels=block_labels, x_label=x_label,
                                      y_label=y_label, value_range=bounds)

        chart = block_head_chart(matrix, unit, block_labels, title, x_label=x_label, y_label=y_label,
                                 value_range=bounds)
        return self.figure(suffix, draw, caption, paper, chart=chart)

    # ------------------------------------------------------------ files (one result alone)

    def save(self, out_dir: str | Path) -> list[Path]:
        """Write this result's tables (``.csv``), summary (``.json``) and large arrays (``.npz``) into ``out_dir``,
        each atomically (``vitscope.outputs.write_run`` writes every result of a run this way)."""

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for stem, frame in self.tables().items():
            with atomic_path(out / f"{stem}.csv") as tmp:
                frame.to_csv(tmp, index=False)
            paths.append(out / f"{stem}.csv")
        paths.append(write_text_atomic(out / f"{self.name}.json", dumps(self.to_json(), indent=1)))
        arrays = self.arrays()
        if arrays:
            with atomic_path(out / f"{self.name}.npz") as tmp:
                save_arrays(tmp, arrays)
            paths.append(out / f"{self.name}.npz")
        return paths

    def plot(self, out_dir: str | Path) -> list[Path]:
        """Draw every figure of :meth:`figures` into ``out_dir``; returns the written files."""
        out = Path(out_dir)
        paths: list[Path] = []
        for fig in self.figures():
            paths += fig.draw(out / fig.stem)
        return paths


class SummaryResult(Result):
    """A result given whole: its JSON summary, tables and figures (experiments that do not stream).

    Args:
        name: the result's name.
        summary: the results.json summary (JSON-able).
        tables: ``{file stem: pandas DataFrame}``.
        figures: its figures.
        tensors: arrays to keep beside (written to ``.npz`` when large, listed in the summary when small).
        intro: the report's paragraph.
    """

    def __init__(self, name: str, summary: dict[str, Any], tables: dict[str, Any] | None = None,
                 figures: list[Figure] | None = None, tensors: dict[str, torch.Tensor] | None = None,
                 intro: str = "") -> None:
        super().__init__(name, dict(tensors or {}), dict(summary), intro)
        self._tables, self._figures = dict(tables or {}), list(figures or [])

    def tables(self) -> dict[str, Any]:
        return dict(self._tables)

    def figures(self) -> list[Figure]:
        return list(self._figures)


def as_result(name: str, computed: Result | Mapping[str, Any]) -> Result:
    """A :class:`Result` from what ``compute()`` returned: a Result as is, or a plain dict (the form
    docs/extending.md shows) whose tensors, and numbers as float64 tensors, become the result's tensors and
    everything else its metadata (``"dims"`` names the tensors' dimensions, :data:`DIMS_KEY`).

    Raises:
        VitscopeTypeError: ``computed`` is neither a Result nor a mapping.
    """
    if isinstance(computed, Result):
        return computed
    if not isinstance(computed, Mapping):
        raise VitscopeTypeError(f"analysis '{name}': compute() returned a {type(computed).__name__}; return a Result "
                                "or a dict of tensors and metadata")
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, Any] = {}
    for key, value in computed.items():
        if isinstance(value, torch.Tensor):
            tensors[key] = value
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            tensors[key] = torch.tensor(value, dtype=torch.float64)
        else:
            meta[key] = value
    return Result(name=name, tensors=tensors, meta=meta)
