"""Last-layer token mixing (paper 001 section 4, table 1, figure 6).

Two interventions on a classifier, through the backbone's staged execution:

* **head on every token**: the classifier head (trained on CLS) applied, without fine-tuning, to each
  token of the last block's output in turn; accuracy per token position, the patch average (the paper's
  text and table) and the patch maximum; and the head on the mean of the patch tokens (the authors' code's
  ``AVG(Patches-CLS)``, ``mean_patch_token_accuracy``). The head is called on a sequence made of copies of
  one token, so every pooling a head does (CLS, mean of patches, CLS and distillation, CLS + mean) sees that
  token alone and the adapter's own ``head`` is reused unchanged. At the CLS position it reproduces the model
  exactly.
* **isolating CLS until block L**: blocks ``0..L-1`` run on the spatial tokens alone (patches attend
  only to patches) while the prefix tokens run through the same blocks with no image tokens (an
  image-independent state); both are concatenated before block L and the rest of the model runs as
  usual. ``L = 0`` is the unmodified model; ``L = num_blocks`` means CLS never sees the image.

Counts are sums declared as state (:class:`TokenMixing`), so two partial runs merge exactly; the pass is
:func:`vitscope.run`'s, with the extra forwards through ``batch.model``. Images of several token grids
(``keep_aspect``) keep their per-token counts per grid: a position means a different place on each grid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from vitscope.analyses.base import Batch, Figure, Result
from vitscope.analyses.grids import by_images, grid_key, grid_of
from vitscope.analyses.masking.base import ModelAccumulator
from vitscope.analyses.result import png_path
from vitscope.errors import VitscopeValueError
from vitscope.models.backbone import Backbone
from vitscope.models.spec import ModelSpec

__all__ = ["TokenMixing", "TokenMixingResult", "isolated_cls_logits", "per_token_logits", "token_mixing"]


def _check(backbone: Backbone) -> None:
    spec = backbone.spec
    if not spec.is_transformer or not spec.classifies:
        raise VitscopeValueError(f"{spec.name}: token mixing needs a transformer classifier (a head that gives class "
                                 "logits); load a *ForImageClassification model or the tiny supervised zoo model")
    if spec.num_prefix_tokens < 1:
        raise VitscopeValueError(f"{spec.name} has no CLS token")


def _last_tokens(backbone: Backbone, tokens: torch.Tensor) -> torch.Tensor:
    """What ``head`` reads: the final norm's output, or the last block's output for heads placed before it."""
    return backbone.final_norm(tokens) if backbone.head_after_final_norm else tokens


@torch.no_grad()
def per_token_logits(backbone: Backbone, pixels: torch.Tensor) -> torch.Tensor:
    """The classifier head applied to every token on its own.

    Args:
        backbone: a transformer classifier.
        pixels: ``[B, 3, H, W]`` preprocessed.

    Returns:
        ``[B, N, classes]``: position 0 is CLS (reproduces the model's logits for CLS-pooled heads),
        positions ``P..N-1`` the spatial tokens row-major.
    """
    _check(backbone)
    return _head_on_each(backbone, _output_tokens(backbone, pixels))


def _output_tokens(backbone: Backbone, pixels: torch.Tensor) -> torch.Tensor:
    """``[B, N, D]`` what the head reads of every token of the last block."""
    return _last_tokens(backbone, backbone.run_blocks(backbone.embed(pixels)))


def _head_on_each(backbone: Backbone, seq: torch.Tensor) -> torch.Tensor:
    """``[B, M, D]`` tokens -> ``[B, M, classes]``, the head on each token alone."""
    b, n, d = seq.shape
    p = backbone.spec.num_prefix_tokens
    # a sequence of P + 1 copies of each token: any CLS / prefix / mean pooling then sees that token only
    copies = seq.reshape(b * n, 1, d).expand(b * n, p + 1, d)
    return backbone.head(copies).reshape(b, n, -1)


@torch.no_grad()
def isolated_cls_logits(backbone: Backbone, pixels: torch.Tensor, insert_at: int) -> torch.Tensor:
    """Logits when the prefix tokens join the image tokens only from block ``insert_at`` on.

    Args:
        backbone: a transformer classifier whose blocks accept any number of tokens.
        pixels: ``[B, 3, H, W]`` preprocessed.
        insert_at: ``0..num_blocks``; 0 is the unmodified model.

    Returns:
        ``[B, classes]``.
    """
    _check(backbone)
    spec = backbone.spec
    if not 0 <= insert_at <= spec.num_blocks:
        raise VitscopeValueError(f"insert_at must be in 0..{spec.num_blocks}, got {insert_at}")
    tokens = backbone.embed(pixels)
    p = spec.num_prefix_tokens
    if insert_at > 0:
        # prefix tokens are image-independent after embed; one forward with no image tokens serves every image
        no_patch = torch.zeros(1, 0, dtype=torch.long, device=tokens.device)  # rotary families: no spatial token
        prefix = backbone.run_kept(tokens[:1, :p], no_patch, 0, insert_at).expand(tokens.shape[0], -1, -1)
        every = torch.arange(tokens.shape[1] - p, device=tokens.device).expand(tokens.shape[0], -1)
        patches = backbone.run_kept(tokens[:, p:], every, 0, insert_at)
        tokens = torch.cat([prefix, patches], dim=1)
    tokens = backbone.run_blocks(tokens, insert_at, None)
    return backbone.head(_last_tokens(backbone, tokens))


class TokenMixing(ModelAccumulator):
    """Correct predictions of the head on every token and with CLS inserted at each block (mergeable counts).

    Runs in the engine's pass like the masking analyses: every batch's extra forwards go through
    ``batch.model``; labels come from ``batch.targets["label"]`` (the head's class indices).

    Args:
        insert_blocks: CLS insertion blocks to evaluate (default: every ``0..num_blocks``).

    State: ``num_images``; ``correct_token`` ``{"HxW": [N]}`` (the head on each token, per token grid) and
    ``grid_images`` ``{"HxW": images}``, ``correct_model`` (the unmodified model), ``correct_isolated``
    ``[len(insert_blocks)]``, ``correct_mean_patch`` (the head on the mean patch token), all sums; the number of
    prefix tokens and the insertion blocks (the same in every batch).
    """

    name = "token_mixing"
    description = "Accuracy of the classifier head on every output token, and with CLS isolated until block L."
    missing_labels = ("token mixing needs a class label per image (in the head's label space): give labelled data, "
                      "e.g. ROOT::imagefolder")

    def __init__(self, insert_blocks: Sequence[int] | None = None) -> None:
        super().__init__()
        self.insert_blocks = None if insert_blocks is None else [int(b) for b in insert_blocks]

    def _declare_counts(self) -> None:
        self.add_state("correct_token", {}, reduce="sum")  # "HxW" grid -> [N] long
        self.add_state("grid_images", {}, reduce="sum")  # "HxW" grid -> images seen at that grid
        self.add_state("correct_model", 0, reduce="sum")
        self.add_state("correct_mean_patch", 0, reduce="sum")
        self.add_state("correct_isolated", None, reduce="sum")
        self.add_state("num_prefix", None, reduce="same")
        self.add_state("blocks", None, reduce="same")

    def why_unsupported(self, spec: ModelSpec) -> str | None:
        reason = super().why_unsupported(spec)
        if reason is None and spec.num_prefix_tokens < 1:
            reason = f"analysis '{self.name}' reads the CLS token, but {spec.name} has none"
        return reason

    def required_hooks(self, spec: ModelSpec) -> list[str]:
        return []

    def _update_counts(self, record: Mapping[str, torch.Tensor], batch: Batch, labels: torch.Tensor) -> None:
        spec = batch.spec
        blocks = self.insert_blocks if self.insert_blocks is not None else list(range(spec.num_blocks + 1))

        def counts(backbone: Backbone) -> tuple[torch.Tensor, int, torch.Tensor, int]:
            _check(backbone)
            pixels, y = batch.pixels, labels.to(batch.pixels.device)
            full = _model_logits(backbone, pixels)
            self._check_label_range(batch, full.shape[-1])
            model = int((full.argmax(-1) == y).sum())
            with torch.no_grad():
                seq = _output_tokens(backbone, pixels)
                tok = (_head_on_each(backbone, seq).argmax(-1) == y[:, None]).sum(0).long().cpu()
                mean = _head_on_each(backbone, seq[:, spec.num_prefix_tokens:].mean(1, keepdim=True))[:, 0]
            iso = torch.tensor([int((isolated_cls_logits(backbone, pixels, b).argmax(-1) == y).sum())
                                for b in blocks], dtype=torch.long)
            return tok, model, iso, int((mean.argmax(-1) == y).sum())

        tok, model, iso, mean_patch = self._run(counts, batch)
        key = grid_key(batch.grid)  # position i is a different place on another grid
        self.correct_token[key] = tok if key not in self.correct_token else self.correct_token[key] + tok
        self.grid_images[key] = self.grid_images.get(key, 0) + batch.size
        self.correct_isolated = iso if self.correct_isolated is None else self.correct_isolated + iso
        self.correct_model += model
        self.correct_mean_patch += mean_patch
        self.num_prefix, self.blocks = spec.num_prefix_tokens, blocks

    def compute(self) -> TokenMixingResult:
        """Accuracies; per-token ones per grid, the grid of most images under the plain names, others ``@HxW``.

        ``cls_token_accuracy``, ``patch_average`` (the accuracy of the head on each patch token, averaged over each
        image's own grid) and ``mean_patch_token_accuracy`` (the head on the mean patch token) are over every
        image; ``patch_maximum``, ``patch_minimum`` and ``best_patch`` name positions of the main grid.
        """
        if not self.correct_token or self.num_images == 0:
            return TokenMixingResult(self.name, {}, {"num_images": 0})
        total, p = self.num_images, self.num_prefix
        grids = by_images(self.grid_images.items())
        tensors: dict[str, torch.Tensor] = {}
        cls_correct, patch_sum = 0, 0.0
        for j, (key, n) in enumerate(grids):
            acc = self.correct_token[key].double() / n
            suffix = "" if j == 0 else f"@{key}"
            tensors[f"token_accuracy{suffix}"] = acc
            tensors[f"token_accuracy_grid{suffix}"] = acc[p:].reshape(grid_of(key))
            cls_correct += int(self.correct_token[key][0])
            patch_sum += float(acc[p:].mean()) * n
        spatial = tensors["token_accuracy"][p:]
        tensors |= {"isolate_cls_accuracy": self.correct_isolated.double() / total,
                    "isolate_cls_block": torch.tensor(self.blocks, dtype=torch.long)}
        meta = {**self._meta(), "model_accuracy": self.correct_model / total,
                "cls_token_accuracy": cls_correct / total, "patch_average": patch_sum / total,
                "mean_patch_token_accuracy": self.correct_mean_patch / total,
                "patch_maximum": float(spatial.max()), "patch_minimum": float(spatial.min()),
                "best_patch": int(spatial.argmax()),
                "isolate_cls": {str(b): float(a) for b, a in zip(self.blocks, tensors["isolate_cls_accuracy"])}}
        if len(grids) > 1:
            meta["grids"] = {key: int(n) for key, n in grids}
        return TokenMixingResult(self.name, tensors, meta)


def _model_logits(backbone: Backbone, pixels: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = backbone(pixels)
    return getattr(out, "logits", out)


class TokenMixingResult(Result):
    """Accuracies of the token-mixing experiments (table 1 rows in ``meta``, figure 6 in ``figures``)."""

    DIMS = {"token_accuracy": ("token",), "token_accuracy@*": ("token",), "token_accuracy_grid": ("row", "column"),
            "token_accuracy_grid@*": ("row", "column"),
            "isolate_cls_*": ("block",)}

    def figures(self) -> list[Figure]:
        """``<name>_token_accuracy`` (accuracy of the head on every token) and ``<name>_isolate_cls``."""
        if not self.tensors:
            return []

        def tokens(path: Path) -> list[Path]:
            from vitscope.viz.featviz_figures import token_accuracy_figure

            return [token_accuracy_figure(self.tensors["token_accuracy_grid"], self.meta["cls_token_accuracy"],
                                          png_path(path))]

        def isolate(path: Path) -> list[Path]:
            from vitscope.viz.featviz_figures import isolate_cls_figure

            return [isolate_cls_figure(self.tensors["isolate_cls_accuracy"], png_path(path))]

        from vitscope.viz.charts import block_head_chart, block_lines_chart, curve

        grid, cls = self.tensors["token_accuracy_grid"], float(self.meta["cls_token_accuracy"])
        grid_chart = block_head_chart(grid, "accuracy", title=f"Head applied to each patch token (CLS token: "
                                      f"{cls:.3f})", x_label="column", y_label="row", value_range=(0.0, 1.0))
        isolated, model = self.tensors["isolate_cls_accuracy"], self.meta.get("model") or "model"
        isolate_chart = block_lines_chart([curve(model, isolated, model)], "accuracy", isolated.numel(),
                                          title="Isolating CLS until block L (0 = unmodified model)",
                                          y_range=(0.0, 1.0), x_label="block where CLS is inserted")
        return [self.figure("_token_accuracy", tokens, "Accuracy of the classifier applied to every output token, "
                            "on the token grid (the CLS token's accuracy in the title).", "paper 001, fig. 6",
                            chart=grid_chart),
                self.figure("_isolate_cls", isolate, "Accuracy when the CLS token is inserted at a later block and "
                            "attends only to itself before it.", "paper 001, table 1", chart=isolate_chart)]


def token_mixing(
    backbone: Backbone,
    data: Any,
    insert_blocks: Sequence[int] | None = None,
    *,
    batch_size: int = 32,
    limit: int | None = None,
    device: str | torch.device | None = None,
    progress: bool | None = False,
) -> TokenMixingResult:
    """Run both token-mixing experiments in one pass of :func:`vitscope.run` over labelled images.

    Args:
        backbone: a transformer classifier (HF ``*ForImageClassification`` or the tiny supervised zoo model).
        data: labelled images whose labels index the head's classes: any source :func:`vitscope.run` reads
            (``"ROOT::imagefolder"``, a reader of :func:`vitscope.data.load_dataset`, ``InMemoryImages(images,
            labels=...)``).
        insert_blocks: CLS insertion blocks to evaluate (default: every ``0..num_blocks``).
        batch_size: images per batch.
        limit: at most this many images.
        device: where to run (default: the backbone's device).
        progress: show a progress bar.

    Returns:
        A :class:`TokenMixingResult`: ``token_accuracy [N]``, ``token_accuracy_grid [h, w]`` (of the grid of most
        images; with several grids the others' as ``token_accuracy@HxW`` and ``token_accuracy_grid@HxW``, and
        ``meta["grids"]``), ``isolate_cls_accuracy [len(insert_blocks)]``; meta holds the model, CLS,
        patch-average, patch-maximum and mean-patch-token accuracies.
    """
    from vitscope.engine.run import run

    _check(backbone)
    analysis = TokenMixing(insert_blocks)
    return run(backbone, data, [analysis], batch_size=batch_size, limit=limit, device=device,
               progress=progress)[analysis.name]
