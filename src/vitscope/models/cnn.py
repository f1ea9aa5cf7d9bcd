"""Adapter for convolutional backbones: stem, stages, final feature map, pooled classifier.

Hook names: ``embed`` (stem output), ``stages.{i}`` ``[B, C, h, w]``, ``features`` (the last map
before pooling). Staged execution runs stages instead of blocks on feature maps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vitscope.hooks.edits import Edits
from vitscope.hooks.record import Record, Removable
from vitscope.models.backbone import Backbone
from vitscope.models.block_edits import replace_first
from vitscope.models.spec import ModelSpec


@dataclass
class CNNLayout:
    """Where the parts of a CNN live.

    Attributes:
        stem: module from pixels to the first map.
        stages: the stage modules, in order.
        post: module applied to the last stage's output to give ``features`` (BiT's final norm), or None.
        pool: ``features [B, C, h, w] -> [B, C]`` (or ``[B, C, 1, 1]``) as the model pools.
        classifier: module from the pooled vector to logits, or None.
        call: how to run the whole model on pixels.
        pooled_norm: the LayerNorm ``pool`` applies after the mean over positions (ConvNeXt's), or None.
    """

    stem: nn.Module
    stages: list[nn.Module]
    post: nn.Module | None
    pool: Callable[[torch.Tensor], torch.Tensor]
    classifier: nn.Module | None
    call: Callable[[torch.Tensor], Any]
    pooled_norm: nn.LayerNorm | None = None


class CNNBackbone(Backbone):
    """Backbone over a CNN described by a :class:`CNNLayout`."""

    def __init__(self, model: nn.Module, spec: ModelSpec, layout: CNNLayout) -> None:
        super().__init__(model, spec)
        self.layout = layout

    def grid_at(self, image_size: tuple[int, int]) -> tuple[int, int]:
        return final_map_shape(self.layout, image_size)[1:]

    def forward(self, pixels: torch.Tensor, **kwargs: Any) -> Any:
        return self.layout.call(pixels, **kwargs)

    def embed(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.layout.stem(pixels)

    def run_blocks(self, tokens: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        for stage in self.layout.stages[start:stop]:
            out = stage(tokens)
            tokens = out[0] if isinstance(out, tuple) else out
        return tokens

    def final_norm(self, tokens: torch.Tensor) -> torch.Tensor:
        """The map after the last stage's post-processing (``features``)."""
        return self.layout.post(tokens) if self.layout.post is not None else tokens

    @property
    def pooled_norm(self) -> nn.LayerNorm | None:
        """The LayerNorm the model applies to the mean of its ``features`` (ConvNeXt's), or None."""
        return self.layout.pooled_norm

    def head(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.layout.classifier is None:
            return super().head(tokens)
        return self.layout.classifier(self.layout.pool(tokens))

    def _install_edits(self, edits: Edits) -> list[Removable]:
        return install_cnn_edits(self.layout, edits)

    def _install(self, rec: Record) -> list[Removable]:
        lay = self.layout
        handles: list[Removable] = []

        def put(name: str):
            return lambda m, a, out: rec.put(name, out[0] if isinstance(out, tuple) else out)

        if rec.wants("embed"):
            handles.append(lay.stem.register_forward_hook(put("embed")))
        for i, stage in enumerate(lay.stages):
            if rec.wants(f"stages.{i}"):
                handles.append(stage.register_forward_hook(put(f"stages.{i}")))
        if rec.wants("features"):
            last = lay.post if lay.post is not None else lay.stages[-1]
            handles.append(last.register_forward_hook(put("features")))
        return handles


def _edit_output(names: list[str], edits: Edits):
    def hook(m, a, out):
        x = out[0] if isinstance(out, tuple) else out
        y = x
        for name in names:
            y = edits.apply(name, y)
        return None if y is x else replace_first(out, y)
    return hook


def install_cnn_edits(layout: CNNLayout, edits: Edits) -> list[Removable]:
    """Forward hooks applying ``edits`` to ``embed`` (the stem), ``stages.{i}`` and ``features`` (in that order
    where two names are one module's output)."""
    at: dict[int, tuple[nn.Module, list[str]]] = {}

    def add(module: nn.Module, name: str) -> None:
        if edits.wants(name):
            at.setdefault(id(module), (module, []))[1].append(name)

    add(layout.stem, "embed")
    for i, stage in enumerate(layout.stages):
        add(stage, f"stages.{i}")
    add(layout.post if layout.post is not None else layout.stages[-1], "features")
    return [module.register_forward_hook(_edit_output(names, edits), prepend=True) for module, names in at.values()]


def final_map_shape(layout: CNNLayout, image_size: tuple[int, int]) -> tuple[int, int, int]:
    """``(channels, h, w)`` of the last stage's map for an ``image_size`` input (one dummy forward)."""
    with torch.no_grad():
        param = next(iter(layout.stem.parameters()))
        x = torch.zeros(1, 3, *image_size, dtype=param.dtype, device=param.device)
        x = layout.stem(x)
        for stage in layout.stages:
            out = stage(x)
            x = out[0] if isinstance(out, tuple) else out
    c, h, w = x.shape[1:]
    return int(c), int(h), int(w)


def cnn_spec(name: str, family: str, model_call: Callable[[torch.Tensor], Any], layout: CNNLayout,
             image_size: tuple[int, int], has_head: bool, **preprocess: Any) -> ModelSpec:
    """Measure channels, grid and stride with one dummy forward of the stem and stages."""
    c, h, w = final_map_shape(layout, image_size)
    return ModelSpec(name=name, family=family, kind="cnn", num_blocks=len(layout.stages), num_heads=0,
                     embed_dim=int(c), mlp_dim=0, patch_size=image_size[0] // h, grid=(int(h), int(w)),
                     num_prefix_tokens=0, prefix_kinds=(), image_size=image_size, has_head=has_head, **preprocess)


def hf_cnn_layout(model: nn.Module) -> CNNLayout:
    """Layout of a transformers ResNet, BiT or ConvNeXt (with or without the classifier)."""
    base = model
    for attr in ("resnet", "bit", "convnext"):
        if hasattr(model, attr):
            base = getattr(model, attr)
    stem = getattr(base, "embedder", None) or base.embeddings
    family = type(base).__name__.lower()
    pooled_norm = base.layernorm if "convnext" in family else None
    if pooled_norm is not None:
        def pool(x: torch.Tensor) -> torch.Tensor:
            return pooled_norm(x.mean([-2, -1]))
    else:
        pool = base.pooler
    post = base.norm if "bit" in family and isinstance(getattr(base, "norm", None), nn.Module) else None
    return CNNLayout(stem=stem, stages=list(base.encoder.stages), post=post, pool=pool,
                     classifier=getattr(model, "classifier", None),
                     call=lambda pixels, **kw: model(pixel_values=pixels, **kw), pooled_norm=pooled_norm)


def tiny_resnet_layout(model: nn.Module) -> CNNLayout:
    return CNNLayout(stem=model.stem, stages=list(model.stages), post=None,
                     pool=lambda x: model.pool(x).flatten(1),
                     classifier=model.fc if isinstance(model.fc, nn.Linear) else None, call=model)
