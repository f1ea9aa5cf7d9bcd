"""Adapter for Hugging Face vision transformers (ViT, DeiT, DINO, DINOv2, CLIP, SigLIP, MAE, BEiT)."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from vitscope.hooks.record import Record, Removable
from vitscope.models.backbone import Backbone
from vitscope.models.block_hooks import install_block_hooks
from vitscope.models.hf_attention import capture_hf_attention
from vitscope.models.hf_layout import (
    attention_module,
    block_modules,
    final_norm_module,
    find_base,
    find_layers,
)
from vitscope.models.spec import ModelSpec


def _accepts(fn: Any, arg: str) -> bool:
    return arg in inspect.signature(fn).parameters


class HFViTBackbone(Backbone):
    """Wraps a transformers ViT-family model without changing it.

    Staged execution mirrors the model's own forward: ``embed`` = embeddings (+ CLIP's
    ``pre_layrnorm``), ``run_blocks`` calls the model's own layers (BEiT receives its
    resolution and shared relative position bias exactly as in ``BeitModel.forward``),
    ``final_norm`` = the final LayerNorm on every token. ViT-MAE is run with ``mask_ratio=0``
    and a fixed increasing ``noise`` so patches keep their order and nothing is masked.
    """

    def __init__(self, model: nn.Module, spec: ModelSpec) -> None:
        super().__init__(model, spec)
        self.base = find_base(model)
        self.layers = find_layers(self.base)
        self.blocks = [block_modules(layer) for layer in self.layers]
        self._final_norm, self._norm_on_sequence = final_norm_module(self.base)
        self.family = spec.family
        self.head_after_final_norm = spec.family != "clip"
        self._last_hw = spec.image_size

    # -- running --------------------------------------------------------------------------
    def _mae_noise(self, pixels: torch.Tensor) -> torch.Tensor:
        h, w = self.spec.grid_for(*pixels.shape[-2:])
        return torch.arange(h * w, device=pixels.device, dtype=torch.float32).expand(pixels.shape[0], -1)

    def _size_kwargs(self, fn: Any, pixels: torch.Tensor) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        if tuple(pixels.shape[-2:]) != tuple(self.spec.image_size) and _accepts(fn, "interpolate_pos_encoding"):
            kw["interpolate_pos_encoding"] = True
        if self.family == "vit_mae" and _accepts(fn, "noise"):
            kw["noise"] = self._mae_noise(pixels)
        return kw

    def forward(self, pixels: torch.Tensor, **kwargs: Any) -> Any:
        call = {**self._size_kwargs(self.model.forward, pixels), **kwargs}
        return self.model(pixel_values=pixels, **call)

    # -- staged execution -------------------------------------------------------------------
    def embed(self, pixels: torch.Tensor) -> torch.Tensor:
        emb = self.base.embeddings
        out = emb(pixels, **self._size_kwargs(emb.forward, pixels))
        tokens = out[0] if isinstance(out, tuple) else out
        if hasattr(self.base, "pre_layrnorm"):
            tokens = self.base.pre_layrnorm(tokens)
        self._last_hw = tuple(pixels.shape[-2:])
        return tokens

    def _layer_kwargs(self, tokens: torch.Tensor) -> dict[str, Any]:
        if self.family != "beit":
            return {"attention_mask": None}
        hw = self._resolution(tokens)
        kw: dict[str, Any] = {"resolution": hw, "interpolate_pos_encoding": hw != tuple(self.spec.image_size)}
        shared = getattr(self.base, "shared_position_bias", None)
        if shared is not None:
            window = (hw[0] // self.spec.patch_size, hw[1] // self.spec.patch_size)
            kw["attention_mask"] = shared(window, interpolate_pos_encoding=kw["interpolate_pos_encoding"],
                                          dim_size=tokens.shape[1])
        else:
            kw["attention_mask"] = None
        return kw

    def _resolution(self, tokens: torch.Tensor) -> tuple[int, int]:
        if tokens.shape[1] == self.spec.num_tokens:
            return tuple(self.spec.image_size)
        return tuple(self._last_hw)

    def run_blocks(self, tokens: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        kw = self._layer_kwargs(tokens)
        for layer in self.layers[start:stop]:
            out = layer(tokens, **kw)
            tokens = out[0] if isinstance(out, tuple) else out
        return tokens

    def final_norm(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._final_norm(tokens)

    def head(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits from the classifier of a ``*ForImageClassification`` model.

        Pools exactly as that class's forward: CLS (ViT, DeiT), the mean of CLS and distillation
        logits (DeiT with teacher), CLS concatenated with the patch mean (DINOv2), the BEiT pooler,
        the mean of patch tokens before the final norm (CLIP) or of all tokens (SigLIP).
        """
        m, p = self.model, self.spec.num_prefix_tokens
        if not self.spec.has_head:
            return super().head(tokens)
        if hasattr(m, "cls_classifier"):
            return (m.cls_classifier(tokens[:, 0]) + m.distillation_classifier(tokens[:, 1])) / 2
        if self.family in ("dinov2", "dinov2_with_registers"):
            return m.classifier(torch.cat([tokens[:, 0], tokens[:, p:].mean(dim=1)], dim=1))
        if self.family == "beit":
            return m.classifier(self.base.pooler(tokens))
        if self.family == "clip":
            return m.classifier(tokens[:, 1:].mean(dim=1))
        if self.family == "siglip":
            return m.classifier(tokens.mean(dim=1))
        return m.classifier(tokens[:, 0])

    # -- recording --------------------------------------------------------------------------
    def _install(self, rec: Record) -> list[Removable]:
        def capture(i: int, r: Record) -> list[Removable]:
            return capture_hf_attention(attention_module(self.layers[i]), i, r)

        handles = install_block_hooks(self.blocks, rec, capture,
                                      self._final_norm if self._norm_on_sequence else None)
        if rec.wants("final_norm") and not self._norm_on_sequence:
            # CLIP normalises only the pooled CLS; apply the same norm to every token of the last block.
            last = self.layers[-1]
            handles.append(last.register_forward_hook(
                lambda m, a, out: rec.put("final_norm", self._final_norm(out[0] if isinstance(out, tuple) else out))))
        return handles
