"""Adapter for any module laid out like timm's VisionTransformer, without importing timm.

Attention capture reads what the attention module computes anyway: ``attn.qkv``'s output gives
v (and q, k), ``attn.q_norm`` / ``attn.k_norm`` outputs give q and k as they enter the kernel;
after the module ran, the pattern is ``softmax((q * scale) @ k^T)`` in float32, the eager
formula of timm. Only that product and softmax are recomputed (never the projections), the
fused kernel keeps running, and the model's output is unchanged bit for bit.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from vitscope.errors import VitscopeTypeError
from vitscope.hooks.edits import Edits
from vitscope.hooks.record import CallbackRemovable, Record, Removable
from vitscope.models.backbone import Backbone
from vitscope.models.block_edits import install_block_edits
from vitscope.models.block_hooks import BlockModules, install_block_hooks
from vitscope.models.spec import ModelSpec

REQUIRED = ("patch_embed", "pos_embed", "blocks", "norm")
BLOCK_REQUIRED = ("norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.act", "mlp.fc2")


def _get(module: nn.Module, path: str) -> Any:
    obj: Any = module
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def check_timm_layout(model: nn.Module) -> None:
    """Raise a one-line TypeError naming every missing attribute of the timm ViT layout."""
    missing = [p for p in REQUIRED if _get(model, p) is None]
    if not missing:
        missing = [f"blocks[0].{p}" for p in BLOCK_REQUIRED if _get(model.blocks[0], p) is None]
    if missing:
        raise VitscopeTypeError(f"{type(model).__name__} is not laid out like timm's VisionTransformer: "
                                f"missing {', '.join(missing)}")


def _pair(x: Any) -> tuple[int, int]:
    return (int(x[0]), int(x[1])) if isinstance(x, (tuple, list)) else (int(x), int(x))


def _timm_eval_resize(cfg: dict[str, Any], image_size: tuple[int, int]) -> int | tuple[int, int] | None:
    """The resize of timm's evaluation transform for a ``pretrained_cfg`` with a ``crop_pct``: each side
    ``floor(side / crop_pct)``, then a centre crop of ``image_size``; the short side to it (``crop_mode`` center, a
    square input), or the whole image (``squash``). None: nothing said, or a mode not followed (``border``'s
    letterbox, a non-square input's ResizeKeepRatio), which keep the short side resized to the input."""
    pct = cfg.get("crop_pct")
    if not pct:
        return None
    scale = (math.floor(image_size[0] / pct), math.floor(image_size[1] / pct))
    mode = cfg.get("crop_mode") or "center"
    if mode == "squash":
        return scale
    if mode == "center" and scale[0] == scale[1]:
        return scale[0]
    return None


def timm_spec(model: nn.Module, name: str, family: str = "timm", **overrides: Any) -> ModelSpec:
    """Read a ModelSpec off the module layout (timm's ``pretrained_cfg`` supplies mean/std when present)."""
    check_timm_layout(model)
    blk = model.blocks[0]
    pe = model.patch_embed
    patch = _pair(getattr(pe, "patch_size", None) or pe.proj.kernel_size)[0]
    image_size = _pair(getattr(pe, "img_size", None) or (patch * int(round((model.pos_embed.shape[1] - 1) ** 0.5)),))
    prefix: tuple[str, ...] = ()
    if getattr(model, "cls_token", None) is not None:
        prefix += ("cls",)
    if getattr(model, "dist_token", None) is not None:
        prefix += ("dist",)
    if getattr(model, "reg_token", None) is not None:
        prefix += ("reg",) * int(model.reg_token.shape[1])
    cfg = getattr(model, "pretrained_cfg", None) or {}
    head = getattr(model, "head", None)
    kwargs: dict[str, Any] = dict(
        name=name, family=family, kind="transformer", num_blocks=len(model.blocks),
        num_heads=int(blk.attn.num_heads), embed_dim=int(blk.norm1.normalized_shape[0]),
        mlp_dim=int(blk.mlp.fc1.out_features), patch_size=patch,
        grid=(image_size[0] // patch, image_size[1] // patch), num_prefix_tokens=len(prefix),
        prefix_kinds=prefix, image_size=image_size, has_head=isinstance(head, nn.Linear),
    )
    kwargs["preprocessing"] = "ImageNet defaults (the module has no pretrained_cfg)"
    if "mean" in cfg:
        kwargs.update(mean=tuple(cfg["mean"]), std=tuple(cfg["std"]),
                      interpolation=cfg.get("interpolation", "bicubic"), preprocessing="timm pretrained_cfg")
    resize = _timm_eval_resize(cfg, image_size)
    if resize is not None:
        kwargs.update(resize_size=resize, preprocessing="timm pretrained_cfg")
    if cfg:  # a timm model: its evaluation transform rounds as torchvision's Resize and CenterCrop
        kwargs["resize_rule"] = "torchvision"
    kwargs.update(overrides)
    if "image_size" in overrides:  # the grid follows the input size
        kwargs["image_size"] = _pair(kwargs["image_size"])
        kwargs["grid"] = (kwargs["image_size"][0] // patch, kwargs["image_size"][1] // patch)
    return ModelSpec(**kwargs)


#: id(attention module) -> the pattern an intervention edited in its last call (read by a recording)
_EDITED_PATTERNS: dict[int, torch.Tensor] = {}


def _unless_same(out: torch.Tensor, edited: torch.Tensor) -> torch.Tensor | None:
    return None if edited is out else edited


class TimmLayoutBackbone(Backbone):
    """Backbone over a timm-style VisionTransformer (timm itself or vitscope's tiny ViT)."""

    def __init__(self, model: nn.Module, spec: ModelSpec) -> None:
        check_timm_layout(model)
        super().__init__(model, spec)
        self.blocks = [
            BlockModules(layer=b, norm1=b.norm1, norm2=b.norm2, attn_end=getattr(b, "ls1", b.attn),
                         mlp_end=getattr(b, "ls2", b.mlp), mlp_out_proj=b.mlp.fc2, attn_out_proj=b.attn.proj,
                         num_heads=int(b.attn.num_heads))
            for b in model.blocks
        ]

    @property
    def resizable_input(self) -> bool:
        return bool(getattr(self.model, "dynamic_img_size", False))  # timm's flag for interpolated positions

    def forward(self, pixels: torch.Tensor, **kwargs: Any) -> Any:
        return self.model(pixels, **kwargs)

    def embed(self, pixels: torch.Tensor) -> torch.Tensor:
        m = self.model
        x = m.patch_embed(pixels)
        if hasattr(m, "_pos_embed"):
            x = m._pos_embed(x)
        else:
            x = x.flatten(1, 2) if x.dim() == 4 else x
            x = torch.cat([m.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + m.pos_embed
        for name in ("patch_drop", "norm_pre"):
            if isinstance(getattr(m, name, None), nn.Module):
                x = getattr(m, name)(x)
        return x

    def run_blocks(self, tokens: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        for blk in list(self.model.blocks)[start:stop]:
            tokens = blk(tokens)
        return tokens

    def final_norm(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.norm(tokens)

    def head(self, tokens: torch.Tensor) -> torch.Tensor:
        if not self.spec.has_head:
            return super().head(tokens)
        if hasattr(self.model, "forward_head"):
            return self.model.forward_head(tokens)
        return self.model.head(tokens[:, 0])

    def _install(self, rec: Record) -> list[Removable]:
        return install_block_hooks(self.blocks, rec, self._capture_attention, self.model.norm)

    def _install_edits(self, edits: Edits) -> list[Removable]:
        return install_block_edits(self.blocks, edits, self._edit_attention, self.model.norm)

    def _edit_attention(self, i: int, edits: Edits) -> list[Removable]:
        """Edits of ``blocks.{i}.attn.q|k|v|pattern``: q and k at the output of their norms (as they enter the
        kernel; through the fused projection when the block has none), v through the fused projection, the pattern
        at the attention dropout of the explicit (non-fused) path, which the block then runs."""
        attn = self.model.blocks[i].attn
        p = f"blocks.{i}.attn."
        heads = int(attn.num_heads)
        norms = {key: getattr(attn, f"{key}_norm", None) for key in ("q", "k")}
        through_qkv = [key for key in ("q", "k", "v") if edits.wants(p + key) and
                       not isinstance(norms.get(key), nn.Module)]
        handles: list[Removable] = []
        if through_qkv:
            def on_qkv(m, a, out):
                b, n, _ = out.shape
                parts = out.reshape(b, n, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)  # q, k, v [B, H, N, Dh]
                edited = [edits.apply(p + key, t) if key in through_qkv else t for key, t in zip("qkv", parts)]
                if all(e is t for e, t in zip(edited, parts)):
                    return None
                return torch.stack(edited).permute(1, 3, 0, 2, 4).reshape(b, n, -1)
            handles.append(attn.qkv.register_forward_hook(on_qkv, prepend=True))
        for key, norm in norms.items():
            if edits.wants(p + key) and isinstance(norm, nn.Module):
                handles.append(norm.register_forward_hook(
                    lambda m, a, out, _key=key: _unless_same(out, edits.apply(p + _key, out)), prepend=True))
        if edits.wants(p + "pattern"):
            fused = attn.fused_attn

            def on_pattern(m, a, out):
                edited = edits.apply(p + "pattern", out)
                _EDITED_PATTERNS[id(attn)] = edited
                return None if edited is out else edited
            attn.fused_attn = False  # the explicit path: its attention dropout receives the pattern
            handles += [attn.attn_drop.register_forward_hook(on_pattern, prepend=True),
                        CallbackRemovable(lambda: (setattr(attn, "fused_attn", fused),
                                                   _EDITED_PATTERNS.pop(id(attn), None)))]
        return handles

    def _capture_attention(self, i: int, rec: Record) -> list[Removable]:
        attn = self.model.blocks[i].attn
        p = f"blocks.{i}.attn."
        heads = int(attn.num_heads)
        seen: dict[str, torch.Tensor] = {}

        def on_qkv(m, a, out):
            b, n, _ = out.shape
            q, k, v = out.reshape(b, n, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
            seen.update(q=q, k=k, v=v)

        def on_norm(key):
            return lambda m, a, out: seen.__setitem__(key, out)

        def on_attn(m, a, out):
            q, k = seen["q"], seen["k"]
            rec.put(p + "q", q)
            rec.put(p + "k", k)
            rec.put(p + "v", seen["v"])
            # an intervention's pattern, as the block used it in this call (every recording open reads it; the
            # edit sets it again in every call and removes it when it ends)
            edited = _EDITED_PATTERNS.get(id(attn))
            if rec.wants(p + "pattern"):
                if edited is not None:
                    rec.put(p + "pattern", edited.float())
                else:
                    logits = (q * attn.scale) @ k.transpose(-2, -1)
                    rec.put(p + "pattern", logits.softmax(dim=-1, dtype=torch.float32))
            seen.clear()

        handles = [attn.qkv.register_forward_hook(on_qkv), attn.register_forward_hook(on_attn)]
        for key in ("q", "k"):
            norm = getattr(attn, f"{key}_norm", None)
            if isinstance(norm, nn.Module):
                handles.append(norm.register_forward_hook(on_norm(key)))
        return handles
