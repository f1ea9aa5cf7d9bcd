"""CKA between the blocks of one model (``BlockCKA``), and between models from cached features.

Conventions: docs/methods.md, Representations (features for CKA, linear CKA, minibatch CKA, sites). Block-by-block
CKA is paper 002 figures 20 to 22 (the 002 code used the ``norm1`` / ``norm2`` sites there: pass
``site="norm1"``); model-by-model CKA of one block is figures 6 and 19 (:func:`cross_model_cka`).
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitscope.analyses.attention.base import has_cls_token
from vitscope.analyses.base import Analysis, Batch, Figure, Result
from vitscope.analyses.data_checks import DataFacts
from vitscope.analyses.registry import register_analysis
from vitscope.analyses.representation.cka_state import (
    check_cka_options,
    hsic_state_cka,
    merge_hsic,
    minibatch_meta,
    new_hsic_state,
    prepared,
    warn_if_sorted_by_class,
)
from vitscope.analyses.representation.hsic import MinibatchHSIC, chunked_gram
from vitscope.analyses.representation.shuffled_hsic import shuffled_positions
from vitscope.cache.feature_cache import CacheEntry
from vitscope.errors import VitscopeValueError
from vitscope.functional.cka import features_for_cka
from vitscope.functional.cka_grams import cka_from_hsic, hsic_matrix
from vitscope.hooks.names import split_block_name
from vitscope.hooks.tokens import grid_to_tokens
from vitscope.models.spec import ModelSpec

__all__ = ["BlockCKA", "CKAResult", "cka_between", "cka_features", "cross_model_cka", "site_choice_reason",
           "token_choice_reason"]


def cka_features(x: torch.Tensor, spec: ModelSpec, tokens: str, name: str = "") -> torch.Tensor:
    """One CKA feature vector per image from a recorded tensor (docs/methods.md "Features for CKA").

    Args:
        x: ``[B, N, D]`` tokens of a transformer, or a CNN map ``[B, C, h, w]`` (its h*w positions are the spatial
            tokens).
        spec: the model of the batch (its prefix tokens; CNN maps have none).
        tokens: ``"all"``, ``"cls"``, ``"spatial"`` or ``"spatial_mean"``.
        name: the hook ``x`` was recorded at, for the messages.

    Returns:
        ``[B, F]``.

    Raises:
        VitscopeValueError: a transformer tensor that is not ``[B, N, D]`` (a per-head site), or ``tokens="cls"`` on
            a model whose first token is not a CLS token (registers only).
    """
    if spec.is_transformer and x.dim() != 3:  # [B, H, N, Dh] would otherwise pass for a CNN map [B, C, h, w]
        raise VitscopeValueError(f"CKA compares token features [B, N, D], but {name or 'the site'} of {spec.name} is "
                                 f"{list(x.shape)}; choose a residual site (resid_post, norm1, norm2, ...)")
    if tokens == "cls" and not has_cls_token(spec):  # token 0 of a register-only model is a register
        raise VitscopeValueError(f"tokens='cls' needs a CLS token, but {spec.name} has none (prefix tokens "
                                 f"{list(spec.prefix_kinds)}); use 'spatial_mean' instead")
    num_prefix = spec.num_prefix_tokens
    if not spec.is_transformer:
        x, num_prefix = grid_to_tokens(x), 0
    return features_for_cka(x, num_prefix, tokens)  # type: ignore[arg-type]


def site_choice_reason(name: str, site: str, spec: ModelSpec) -> str | None:
    """Why ``blocks.*.<site>`` cannot be a CKA feature on ``spec`` (None when it can), asked before the pass: the
    ``attn.*`` sites hold one tensor per head (``[B, H, N, Dh]``, the pattern ``[B, H, N, N]``), not tokens."""
    if spec.is_transformer and site.startswith("attn."):
        return (f"analysis '{name}' compares token features [B, N, D], but blocks.*.{site} holds one tensor per "
                f"head; set {name}.site to a residual site (resid_post, norm1, norm2, attn_out, mlp_out...)")
    return None


def token_choice_reason(name: str, tokens: str, spec: ModelSpec) -> str | None:
    """Why ``tokens`` cannot be a CKA feature on ``spec`` (None when it can), asked before the pass: ``"cls"`` on a
    model without a CLS token (a CNN, SigLIP, a ViT with registers only), and every token of an image flattened
    (``"all"``, ``"spatial"``) under a token budget (``spec.max_tokens``: each image keeps its aspect ratio and has
    a grid, so a length, of its own)."""
    if tokens == "cls" and not has_cls_token(spec):
        return (f"analysis '{name}' reads the CLS token (tokens='cls'), but {spec.name} has none; set "
                f"{name}.tokens=spatial_mean")
    if spec.max_tokens and tokens in ("all", "spatial"):
        return (f"analysis '{name}' flattens every token of an image (tokens={tokens!r}), but images keep their "
                f"aspect ratios here and have token grids of their own; set {name}.tokens=spatial_mean"
                + (" (or cls)" if has_cls_token(spec) else ""))
    return None


class CKAResult(Result):
    """Result of :class:`BlockCKA`: the block x block heatmap."""

    DIMS = {"cka": ("block_i", "block_j")}

    def figures(self) -> list[Figure]:
        """``<name>``: the block x block CKA heatmap."""
        if "cka" not in self.tensors:
            return []
        m = self.meta
        title = (f"{m.get('model', '')} CKA between blocks ({m.get('site')}, tokens={m.get('tokens')}, "
                 f"{m.get('estimator')}, {m.get('num_images')} images)").strip()

        def draw(path: Path) -> list[Path]:
            from vitscope.viz.representation_figures import cka_heatmap

            return cka_heatmap(self.tensors["cka"], title, path, m.get("blocks"), m.get("blocks"))

        from vitscope.viz.charts import block_head_chart
        from vitscope.viz.ranges import quantity_range

        blocks = m.get("blocks")
        chart = block_head_chart(self.tensors["cka"], "CKA", blocks, title, x_label="block", y_label="block",
                                 column_labels=blocks, value_range=quantity_range("cka"))
        return [self.figure("", draw, "Block-by-block linear CKA of this model: bright cells are blocks that "
                            "compute similar representations (point at a cell for its value).",
                            "paper 002, fig. 20 to 22", chart=chart)]


@register_analysis("cka", groups=("representation",), order=100)
class BlockCKA(Analysis):
    """Linear CKA between every pair of blocks of one model, streamed over a dataset.

    Args:
        site: block site whose output is compared: ``"resid_post"`` (block output, default), ``"norm1"``,
            ``"norm2"`` (the 002 code's sites for block-by-block CKA), or any ``[B, N, D]`` site (the per-head
            ``attn.*`` sites are refused). CNNs always use ``stages.*``, and their ``meta["site"]`` says
            ``"stages"``.
        tokens: features per image: ``"all"`` (every token flattened, the 002 code's default and the
            default here), ``"cls"``, ``"spatial"``, ``"spatial_mean"``.
        estimator: ``"minibatch"`` (unbiased minibatch CKA, streaming, default), ``"full"`` (biased
            full-batch linear CKA) or ``"full_unbiased"``; the full estimators keep features on disk.
        batch: minibatch size of the minibatch estimator (default 64).
        gram_minmax: min-max rescale every minibatch Gram, as the 002 code.
        workdir: folder for spilled features (the full estimators', the shuffled minibatches'; default: a
            temporary folder).
        order: the minibatch estimator's minibatches. ``"dataset"`` (default, the 002 code's): image ``i`` of the
            dataset is in minibatch ``i // batch``, whatever the engine's batch size, number of processes or resume
            point; on data sorted by class (every ``imagefolder``) a minibatch then holds one or two classes and the
            estimate is a within-class CKA. ``"shuffled"``: minibatches of images drawn by a seeded shuffle
            (:class:`~vitscope.analyses.representation.shuffled_hsic.ShuffledHSIC`), the same whatever the engine's
            order, but every image's features wait on disk until the end of the pass, as the full estimators'.
        seed: the shuffle's seed (``order="shuffled"``).

    Memory (why these defaults): with ``order="dataset"`` a minibatch that an engine batch holds whole is reduced
    to its Grams at once (``--batch-size 64`` or a multiple keeps nothing between batches); the rows of a minibatch
    that arrives in pieces wait on disk until it is complete (:mod:`vitscope.analyses.representation.hsic`), so a
    smaller engine batch never costs more memory. Grams are built one representation at a time from float64
    blocks of a few columns. The disk holds at most ``batch - 1`` images of ``L x F`` float32 features (``F`` =
    tokens x width with ``tokens="all"``: 7.3 MB an image for a ViT-B/16 at 224 px). ``tokens="all"`` stays
    the default because the paper's CKA figures used it (the 002 code's ``mode="all"``); ``"cls"`` /
    ``"spatial_mean"`` make every cost 197x smaller. ``order="shuffled"`` and the full estimators keep every
    image's features on disk (with ``tokens="all"``, 7.3 MB an image for a ViT-B/16: pair it with ``"cls"`` or
    ``"spatial_mean"``); the full estimators also need ``L`` float64 ``n x n`` Grams at the end.

    Result tensors: ``cka`` ``[L, L]`` (rows and columns follow ``meta["blocks"]``).
    """

    description = ("Linear CKA between the outputs of every pair of blocks: bright blocks compute similar "
                   "representations.")
    summary = "linear CKA between every pair of blocks"


    def __init__(self, site: str = "resid_post", tokens: str = "all", estimator: str = "minibatch", batch: int = 64,
                 gram_minmax: bool = False, workdir: str | Path | None = None, order: str = "dataset",
                 seed: int = 0) -> None:
        super().__init__()
        check_cka_options(tokens, estimator, batch, order)
        self._cfg_site, self._cfg_tokens, self._cfg_estimator = site, tokens, estimator
        self._cfg_batch, self._cfg_minmax, self._cfg_workdir = int(batch), bool(gram_minmax), workdir
        self._cfg_order, self._cfg_seed = order, int(seed)
        self._sorted_data = False  # dataset-order minibatches warned of before the pass (why_unsupported_data)
        self.add_state("state", functools.partial(new_hsic_state, estimator, int(batch), bool(gram_minmax), True,
                                                  workdir, order, int(seed)), reduce=merge_hsic)
        self.add_state("blocks", [], reduce="same")
        self.add_state("model", "", reduce="same")
        self.add_state("site", "", reduce="same")  # the site read: "stages" on a CNN, whatever was asked

    def required_hooks(self, spec: ModelSpec) -> list[str]:
        return [f"blocks.*.{self._cfg_site}"] if spec.is_transformer else ["stages.*"]

    def read_site(self, spec: ModelSpec) -> str:
        """The site whose CKA is computed on ``spec``: the configured one, ``"stages"`` on a CNN."""
        return self._cfg_site if spec.is_transformer else "stages"

    def why_unsupported(self, spec: ModelSpec) -> str | None:
        return site_choice_reason(self.name, self._cfg_site, spec) or token_choice_reason(self.name, self._cfg_tokens,
                                                                                          spec)

    def why_unsupported_data(self, data: DataFacts) -> str | None:
        if warn_if_sorted_by_class(self.name, data, self._cfg_estimator, self._cfg_order, self._cfg_batch):
            self._sorted_data = True  # results.json says so too (configuration: fresh copies keep it)
        return super().why_unsupported_data(data)

    def _keys(self, record: Mapping[str, torch.Tensor], spec: ModelSpec) -> list[tuple[int, str]]:
        pattern = self.required_hooks(spec)[0]
        found = sorted((int(k.split(".")[1]) if split_block_name(k) is None else split_block_name(k)[0], k)
                       for k in record if fnmatch.fnmatchcase(k, pattern))
        if not found:
            raise VitscopeValueError(f"cka: the record holds no '{pattern}'; record required_hooks(spec)")
        return found

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        """Add one batch: the chosen site of every block, ``[B, N, D]`` (CNN: ``[B, C, h, w]``)."""
        found = self._keys(record, batch.spec)
        blocks = [i for i, _ in found]
        if self.blocks and blocks != self.blocks:
            raise VitscopeValueError(f"cka: blocks {blocks} differ from the blocks seen before {self.blocks}")
        if batch.size == 0:
            return
        self.blocks, self.model, self.site = blocks, batch.spec.name, self.read_site(batch.spec)
        self.state.add(batch.indices, [self.reduced(k, record, batch) for _, k in found])

    def stream_hooks(self, spec: ModelSpec) -> list[str]:
        return self.required_hooks(spec)

    def reduce_hook(self, name: str, tensor: torch.Tensor, batch: Batch) -> Any:
        """The CKA features of one block (:func:`cka_features`), reduced to minibatch Grams when the estimator
        allows (the features of every block would otherwise stay alive until :meth:`update`)."""
        return prepared(self.state, batch.indices, cka_features(tensor, batch.spec, self._cfg_tokens, name))

    def compute(self) -> CKAResult:
        meta = {"model": self.model, "site": self.site or self._cfg_site, "tokens": self._cfg_tokens,
                "estimator": self._cfg_estimator, "batch": self._cfg_batch, "gram_minmax": self._cfg_minmax,
                **minibatch_meta(self._cfg_estimator, self._cfg_order, self._cfg_seed, self._sorted_data),
                "num_images": self.state.count, "blocks": list(self.blocks)}
        cka = hsic_state_cka(self.state, self._cfg_estimator) if self.state.count else None
        if cka is None:
            if self.state.count:
                meta["note"] = "too few images for this estimator (minibatch and unbiased CKA need at least 4)"
            return CKAResult(self.name, {}, meta)
        return CKAResult(self.name, {"cka": cka}, meta)


# -- CKA from cached features (models run in separate passes) ------------------------------------------


def _common_rows(entries: Sequence[CacheEntry]) -> list[np.ndarray]:
    """Row positions of each entry restricted to the image indices they all hold (same order)."""
    indices = [e.index for e in entries]
    common = indices[0]
    for ix in indices[1:]:
        common = np.intersect1d(common, ix)
    if common.size == 0:
        raise VitscopeValueError("the cached features share no image: were they extracted from the same data?")
    return [np.searchsorted(ix, common) for ix in indices]


def _cka_of_reps(reps: list[tuple[CacheEntry, int, np.ndarray]], split: int | None, estimator: str, batch: int,
                 gram_minmax: bool, order: str = "dataset", seed: int = 0, chunk: int = 4096) -> torch.Tensor:
    """CKA between representations given as ``(entry, block, rows)``; ``split`` = number of X reps (None: all
    against all)."""
    check_cka_options("all", estimator, batch, order)
    symmetric = split is None
    index = reps[0][0].index[reps[0][2]]
    if order == "shuffled":  # the rows in shuffled order, numbered by rank: minibatch = rank // batch
        shuffled = shuffled_positions(index, seed)
        reps = [(e, b, rows[shuffled]) for e, b, rows in reps]
        index = np.arange(index.size)
    if estimator == "minibatch":
        state = MinibatchHSIC(batch, gram_minmax, symmetric)
        for start in range(0, index.size, chunk):
            feats = [torch.from_numpy(np.asarray(e.block(b)[rows[start : start + chunk]], dtype=np.float32)
                                      .reshape(len(rows[start : start + chunk]), -1)) for e, b, rows in reps]
            idx = index[start : start + chunk]
            state.add(idx, feats) if symmetric else state.add(idx, feats[:split], feats[split:])
        out = state.cka()
    else:
        def gram(e: CacheEntry, b: int, rows: np.ndarray) -> torch.Tensor:
            arr = e.block(b)
            return chunked_gram([arr[rows[s : s + chunk]] for s in range(0, rows.size, chunk)])

        unbiased = estimator == "full_unbiased"
        grams = torch.stack([gram(*r) for r in reps])
        kx, ky = (grams, None) if symmetric else (grams[:split], grams[split:])
        hxx = hsic_matrix(kx, unbiased=unbiased)
        hyy = hxx if ky is None else hsic_matrix(ky, unbiased=unbiased)
        out = cka_from_hsic(hxx if ky is None else hsic_matrix(kx, ky, unbiased=unbiased), hxx.diagonal(),
                            hyy.diagonal())
    if out is None:
        raise VitscopeValueError(f"too few common images ({index.size}) for the {estimator} CKA estimator")
    return out


def cka_between(a: CacheEntry, b: CacheEntry, blocks_a: Sequence[int] | None = None,
                blocks_b: Sequence[int] | None = None, estimator: str = "minibatch", batch: int = 64,
                gram_minmax: bool = False, order: str = "dataset", seed: int = 0) -> torch.Tensor:
    """CKA between the blocks of two models whose features were cached in separate passes.

    Rows are matched by image index (images missing from either entry are left out). Both entries must use
    the same pooling for the comparison to mean what the paper means (e.g. ``"all"``, ``"cls"``).

    Args:
        a: cache entry of model A (from :func:`vitscope.engine.extract.extract_features`); b: of model B.
        blocks_a: blocks of A (default: every cached block); blocks_b likewise.
        estimator: ``"minibatch"``, ``"full"`` or ``"full_unbiased"``.
        batch: minibatch size; gram_minmax: the 002 code's Gram rescaling.
        order, seed: the minibatches, as :class:`BlockCKA`'s (``"dataset"``: consecutive dataset indices;
            ``"shuffled"``: a seeded shuffle of the common images).

    Returns:
        ``[len(blocks_a), len(blocks_b)]`` float64 CKA.
    """
    ra, rb = _common_rows([a, b])
    ba = list(blocks_a) if blocks_a is not None else a.blocks
    bb = list(blocks_b) if blocks_b is not None else b.blocks
    reps = [(a, i, ra) for i in ba] + [(b, j, rb) for j in bb]
    return _cka_of_reps(reps, len(ba), estimator, batch, gram_minmax, order, seed)


def cross_model_cka(entries: Mapping[str, CacheEntry], block: int | Mapping[str, int] = -1,
                    estimator: str = "minibatch", batch: int = 64, gram_minmax: bool = False, order: str = "dataset",
                    seed: int = 0) -> torch.Tensor:
    """CKA between several models at one block each (paper 002 figures 6 and 19): ``[M, M]``.

    Each model's features were cached once; every pair is computed from them (each model's Gram is built
    once per minibatch, whatever the number of pairs).

    Args:
        entries: ``{model name: cache entry}`` (same data, same pooling).
        block: block index for every model (negative counts from its last cached block), or one per model.
        estimator: ``"minibatch"``, ``"full"`` or ``"full_unbiased"``.
        batch: minibatch size; gram_minmax: the 002 code's Gram rescaling.
        order, seed: the minibatches (:func:`cka_between`).

    Returns:
        ``[M, M]`` float64 CKA in the order of ``entries``.
    """
    names = list(entries)
    rows = _common_rows([entries[n] for n in names])
    reps = []
    for n, r in zip(names, rows):
        b = block[n] if isinstance(block, Mapping) else block
        cached = entries[n].blocks
        reps.append((entries[n], cached[b] if b < 0 else b, r))
    return _cka_of_reps(reps, None, estimator, batch, gram_minmax, order, seed)
