"""Adapter for Hugging Face vision transformers; what differs between families comes from their descriptors
(:mod:`vitscope.models.families`): ViT, DeiT, DINO, DINOv2 (+registers), CLIP, SigLIP, MAE, BEiT."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from vitscope.hooks.edits import Edits
from vitscope.hooks.names import split_block_name
from vitscope.hooks.record import Record, Removable
from vitscope.models.backbone import Backbone
from vitscope.models.block_edits import install_block_edits
from vitscope.models.block_hooks import install_block_hooks, merge_heads, split_heads
from vitscope.models.families import get_family
from vitscope.models.hf_attention import capture_hf_attention, edit_hf_attention
from vitscope.models.hf_layout import (
    attention_module,
    block_modules,
    final_norm_module,
    find_base,
    find_layers,
    find_module,
)
from vitscope.models.spec import ModelSpec

#: the projections before rotary position embeddings (families whose blocks rotate queries and keys)
UNROTATED = ("attn.q_unrotated", "attn.k_unrotated")


def _accepts(fn: Any, arg: str) -> bool:
    return arg in inspect.signature(fn).parameters


def _passes_kwargs(fn: Any) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())


class HFViTBackbone(Backbone):
    """Wraps a transformers ViT-family model without changing it.

    Staged execution mirrors the model's own forward: ``embed`` = embeddings (+ CLIP's
    ``pre_layrnorm``), ``run_blocks`` calls the model's own layers with the arguments the family's
    forward gives them (BEiT: its resolution and shared relative position bias), ``final_norm`` = the
    final LayerNorm on every token. The family's descriptor adds forward arguments (ViT-MAE: nothing
    masked, patches kept in order) and says how the classifier pools.
    """

    def __init__(self, model: nn.Module, spec: ModelSpec) -> None:
        super().__init__(model, spec)
        self.family = get_family(spec.family)
        layout = self.family.layout
        self.base = find_base(model)
        self.layers = find_layers(self.base, layout)
        self.blocks = [block_modules(layer, layout, spec.num_heads) for layer in self.layers]
        self._final_norm, self._norm_on_sequence = final_norm_module(self.base, layout)
        self.head_after_final_norm = self.family.head_after_final_norm
        self.last_input_hw = spec.image_size  # of the last embed() or forward (blocks of some families need it)
        #: the input size the position embeddings were made for (other sizes interpolate them)
        self.native_image_size = tuple(self.family.input_size(getattr(model.config, "vision_config", model.config)))

    @property
    def resizable_input(self) -> bool:
        return self.family.resizable(self.model.config)  # interpolated or computed positions (tested per family)

    # -- running --------------------------------------------------------------------------
    def _size_kwargs(self, fn: Any, pixels: torch.Tensor) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        if tuple(pixels.shape[-2:]) != self.native_image_size and _accepts(fn, "interpolate_pos_encoding"):
            kw["interpolate_pos_encoding"] = True
        return kw | self.family.forward_kwargs(self, fn, pixels)

    def forward(self, pixels: torch.Tensor, **kwargs: Any) -> Any:
        fn = self.model.forward
        if self.base is not self.model and _passes_kwargs(fn):
            fn = self.base.forward  # a classifier handing its keyword arguments to its vision model (CLIP)
        call = {**self._size_kwargs(fn, pixels), **kwargs}
        self.last_input_hw = tuple(pixels.shape[-2:])  # staged blocks run on its recorded tokens read it too
        return self.model(pixel_values=self.family.pixel_values(self, pixels), **call)

    # -- staged execution -------------------------------------------------------------------
    def embed(self, pixels: torch.Tensor) -> torch.Tensor:
        emb = self.base.embeddings
        out = emb(self.family.pixel_values(self, pixels), **self._size_kwargs(emb.forward, pixels))
        tokens = out[0] if isinstance(out, tuple) else out
        if hasattr(self.base, "pre_layrnorm"):
            tokens = self.base.pre_layrnorm(tokens)
        self.last_input_hw = tuple(pixels.shape[-2:])
        return tokens

    @property
    def positions_in_blocks(self) -> bool:
        return self.family.positions_in_blocks or self.family.kept_layers is not None

    def run_kept(self, tokens: torch.Tensor, positions: torch.Tensor, start: int = 0,
                 stop: int | None = None) -> torch.Tensor:
        if self.family.kept_layers is not None:
            with self.family.kept_layers(self, tokens, positions):
                return self._run(tokens, start, stop, self.family.layer_kwargs(self, tokens, positions=positions))
        if not self.family.positions_in_blocks:
            return self.run_blocks(tokens, start, stop)
        return self._run(tokens, start, stop, self.family.layer_kwargs(self, tokens, positions=positions))

    def run_blocks(self, tokens: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        return self._run(tokens, start, stop, self.family.layer_kwargs(self, tokens))

    def _run(self, tokens: torch.Tensor, start: int, stop: int | None, kw: dict[str, Any]) -> torch.Tensor:
        for layer in self.layers[start:stop]:
            out = layer(tokens, **kw)
            tokens = out[0] if isinstance(out, tuple) else out
        return tokens

    def final_norm(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._final_norm(tokens)

    def head(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits from the classifier of a ``*ForImageClassification`` model, pooled as that class's forward
        pools (the family's descriptor: CLS, CLS and distillation, CLS with the patch mean, BEiT's pooler...)."""
        if not self.spec.has_head:
            return super().head(tokens)
        return self.family.head(self, tokens)

    # -- recording --------------------------------------------------------------------------
    def hook_names(self) -> list[str]:
        """The canonical names, and for a family whose blocks rotate queries and keys (DINOv3) the projections
        before the rotation, ``blocks.{i}.attn.q_unrotated`` / ``attn.k_unrotated`` ``[B, H, N, Dh]``."""
        names = super().hook_names()
        if not self.family.positions_in_blocks:
            return names
        out = []
        for name in names:
            out.append(name)
            if name.endswith(".attn.k"):
                out += [name[:-len("attn.k")] + site for site in UNROTATED]
        return out

    def _unrotated_projections(self, names: Iterable[str]) -> list[tuple[str, nn.Module]]:
        """``(name, projection)`` of every ``attn.q_unrotated`` / ``attn.k_unrotated`` among ``names``: the query or
        key projection whose output it is."""
        layout, found = self.family.layout, []
        for name in names:
            parsed = split_block_name(name)
            if parsed and parsed[1] in UNROTATED:
                attn = attention_module(self.layers[parsed[0]], layout)
                found.append((name, find_module(attn, layout.q_proj if parsed[1] == UNROTATED[0] else layout.k_proj,
                                                "projection")))
        return found

    def _capture_unrotated(self, rec: Record) -> list[Removable]:
        heads, handles = self.spec.num_heads, []
        for name, proj in self._unrotated_projections(rec.names):
            def put(m, args, out, _name=name):  # [B, N, H * Dh] -> [B, H, N, Dh], as the kernel's q and k
                rec.put(_name, split_heads(out, heads))
            handles.append(proj.register_forward_hook(put))
        return handles

    def _install_edits(self, edits: Edits) -> list[Removable]:
        def edit(i: int, e: Edits) -> list[Removable]:
            return edit_hf_attention(attention_module(self.layers[i], self.family.layout), i, e)

        handles = install_block_edits(self.blocks, edits, edit,
                                      self._final_norm if self._norm_on_sequence else None)
        return handles + self._edit_unrotated(edits)

    def _edit_unrotated(self, edits: Edits) -> list[Removable]:
        """Edits of the projections before the rotation (DINOv3's ``attn.q_unrotated`` / ``attn.k_unrotated``)."""
        heads, handles = self.spec.num_heads, []
        for name, proj in self._unrotated_projections(edits.names):
            def edit(m, args, out, _name=name):
                split = split_heads(out, heads)
                y = edits.apply(_name, split)
                return None if y is split else merge_heads(y)
            handles.append(proj.register_forward_hook(edit, prepend=True))
        return handles

    def _install(self, rec: Record) -> list[Removable]:
        def capture(i: int, r: Record) -> list[Removable]:
            return capture_hf_attention(attention_module(self.layers[i], self.family.layout), i, r)

        handles = install_block_hooks(self.blocks, rec, capture,
                                      self._final_norm if self._norm_on_sequence else None)
        handles += self._capture_unrotated(rec)
        if rec.wants("final_norm") and not self._norm_on_sequence:
            # CLIP normalises only the pooled CLS; apply the same norm to every token of the last block.
            last = self.layers[-1]
            handles.append(last.register_forward_hook(
                lambda m, a, out: rec.put("final_norm", self._final_norm(out[0] if isinstance(out, tuple) else out))))
        return handles
