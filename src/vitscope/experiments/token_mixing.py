"""Last-layer token mixing (paper 001 section 4, table 1, figure 6).

Two interventions on a classifier, through the backbone's staged execution:

* **head on every token**: the classifier head (trained on CLS) applied, without fine-tuning, to each
  token of the last block's output in turn; accuracy per token position, the patch average and the
  patch maximum. The head is called on a sequence made of copies of one token, so every pooling a
  head does (CLS, mean of patches, CLS and distillation, CLS + mean) sees that token alone and the
  adapter's own ``head`` is reused unchanged. At the CLS position it reproduces the model exactly.
* **isolating CLS until block L**: blocks ``0..L-1`` run on the spatial tokens alone (patches attend
  only to patches) while the prefix tokens run through the same blocks with no image tokens (an
  image-independent state); both are concatenated before block L and the rest of the model runs as
  usual. ``L = 0`` is the unmodified model; ``L = num_blocks`` means CLS never sees the image.

Counts are sums, so two partial runs merge exactly (:meth:`TokenMixingCounts.merge`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vitscope.analyses.base import Figure, Result
from vitscope.analyses.result import png_path
from vitscope.models.backbone import Backbone

__all__ = ["TokenMixingCounts", "TokenMixingResult", "isolated_cls_logits", "per_token_logits", "token_mixing"]

# blocks with a relative position bias sized for the full sequence cannot run on patches alone
_UNSUPPORTED_ISOLATION = ("beit",)


def _check(backbone: Backbone) -> None:
    spec = backbone.spec
    if not spec.is_transformer or not spec.has_head:
        raise ValueError(f"{spec.name}: token mixing needs a transformer classifier (a model with a head); "
                         "load a *ForImageClassification model or the tiny supervised zoo model")
    if spec.num_prefix_tokens < 1:
        raise ValueError(f"{spec.name} has no CLS token")


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
    seq = _last_tokens(backbone, backbone.run_blocks(backbone.embed(pixels)))  # [B, N, D]
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
        raise ValueError(f"insert_at must be in 0..{spec.num_blocks}, got {insert_at}")
    if insert_at > 0 and spec.family in _UNSUPPORTED_ISOLATION:
        raise ValueError(f"{spec.name}: {spec.family} blocks add a position bias sized for the full sequence, "
                         "so patches cannot run without CLS")
    tokens = backbone.embed(pixels)
    p = spec.num_prefix_tokens
    if insert_at > 0:
        # prefix tokens are image-independent after embed; one forward with no image tokens serves every image
        prefix = backbone.run_blocks(tokens[:1, :p], 0, insert_at).expand(tokens.shape[0], -1, -1)
        patches = backbone.run_blocks(tokens[:, p:], 0, insert_at)
        tokens = torch.cat([prefix, patches], dim=1)
    tokens = backbone.run_blocks(tokens, insert_at, None)
    return backbone.head(_last_tokens(backbone, tokens))


@dataclass
class TokenMixingCounts:
    """Mergeable tallies: correct predictions per token position and per CLS insertion block.

    Attributes:
        correct_token: ``[N]`` correct predictions of the head on each token.
        correct_model: correct predictions of the unmodified model.
        correct_isolated: ``[L + 1]`` correct predictions with CLS inserted at block L.
        total: images seen.
    """

    correct_token: torch.Tensor | None = None
    correct_model: int = 0
    correct_isolated: torch.Tensor | None = None
    total: int = 0
    grid: tuple[int, int] = (0, 0)
    num_prefix: int = 1
    insert_blocks: list[int] = field(default_factory=list)

    def update(self, backbone: Backbone, pixels: torch.Tensor, labels: torch.Tensor) -> None:
        labels = labels.to(pixels.device)
        tok = (per_token_logits(backbone, pixels).argmax(-1) == labels[:, None]).sum(0).long().cpu()
        model_logits = _model_logits(backbone, pixels)
        iso = torch.tensor([int((isolated_cls_logits(backbone, pixels, L).argmax(-1) == labels).sum())
                            for L in self.insert_blocks], dtype=torch.long)
        self.merge(TokenMixingCounts(tok, int((model_logits.argmax(-1) == labels).sum()), iso, len(labels),
                                     backbone.spec.grid_for(*pixels.shape[-2:]), backbone.spec.num_prefix_tokens,
                                     list(self.insert_blocks)))

    def merge(self, other: TokenMixingCounts) -> TokenMixingCounts:
        """Add ``other``'s tallies into this one and return it."""
        if other.correct_token is None:
            return self
        if self.correct_token is None:
            self.correct_token, self.correct_isolated = other.correct_token.clone(), other.correct_isolated.clone()
            self.grid, self.num_prefix, self.insert_blocks = other.grid, other.num_prefix, list(other.insert_blocks)
        else:
            if self.correct_token.shape != other.correct_token.shape or self.insert_blocks != other.insert_blocks:
                raise ValueError("cannot merge token-mixing counts of different token counts or insertion blocks")
            self.correct_token = self.correct_token + other.correct_token
            self.correct_isolated = self.correct_isolated + other.correct_isolated
        self.correct_model += other.correct_model
        self.total += other.total
        return self

    def compute(self, name: str = "token_mixing") -> TokenMixingResult:
        if self.correct_token is None or self.total == 0:
            return TokenMixingResult(name, {}, {"num_images": 0})
        acc = self.correct_token.double() / self.total
        p, (h, w) = self.num_prefix, self.grid
        spatial = acc[p:]
        tensors = {"token_accuracy": acc, "token_accuracy_grid": spatial.reshape(h, w),
                   "isolate_cls_accuracy": self.correct_isolated.double() / self.total,
                   "isolate_cls_block": torch.tensor(self.insert_blocks, dtype=torch.long)}
        meta = {"num_images": self.total, "model_accuracy": self.correct_model / self.total,
                "cls_token_accuracy": float(acc[0]), "patch_average": float(spatial.mean()),
                "patch_maximum": float(spatial.max()), "patch_minimum": float(spatial.min()),
                "best_patch": int(spatial.argmax()),
                "isolate_cls": {str(L): float(a) for L, a in zip(self.insert_blocks, tensors["isolate_cls_accuracy"])}}
        return TokenMixingResult(name, tensors, meta)


def _model_logits(backbone: Backbone, pixels: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = backbone(pixels)
    return getattr(out, "logits", out)


class TokenMixingResult(Result):
    """Accuracies of the token-mixing experiments (table 1 rows in ``meta``, figure 6 in ``figures``)."""

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

        return [self.figure("_token_accuracy", tokens, "Accuracy of the classifier applied to every output token, "
                            "on the token grid (the CLS token's accuracy in the title).", "paper 001, fig. 6"),
                self.figure("_isolate_cls", isolate, "Accuracy when the CLS token is inserted at a later block and "
                            "attends only to itself before it.", "paper 001, table 1")]


def token_mixing(
    backbone: Backbone,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    insert_blocks: Sequence[int] | None = None,
    device: str | torch.device | None = None,
) -> TokenMixingResult:
    """Run both token-mixing experiments over labelled batches.

    Args:
        backbone: a transformer classifier (HF ``*ForImageClassification`` or the tiny supervised zoo model).
        batches: ``(pixels [B, 3, H, W] preprocessed, labels [B])`` pairs; labels index the head's classes.
        insert_blocks: CLS insertion blocks to evaluate (default: every ``0..num_blocks``).
        device: where to run (default: the backbone's device).

    Returns:
        A :class:`TokenMixingResult`: ``token_accuracy [N]``, ``token_accuracy_grid [h, w]``,
        ``isolate_cls_accuracy [len(insert_blocks)]``; meta holds the model, CLS, patch-average and
        patch-maximum accuracies.
    """
    _check(backbone)
    blocks = list(range(backbone.spec.num_blocks + 1)) if insert_blocks is None else [int(b) for b in insert_blocks]
    if device is not None:
        backbone.to(device)
    backbone.eval()
    counts = TokenMixingCounts(insert_blocks=blocks)
    for pixels, labels in batches:
        counts.update(backbone, pixels.to(backbone.device), torch.as_tensor(labels))
    return counts.compute()
