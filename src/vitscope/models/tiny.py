"""vitscope's own tiny models, pure torch, laid out exactly like timm's VisionTransformer.

The timm-layout adapter is tested on these, so their module names must stay timm's:
``patch_embed.proj``, ``cls_token``, ``reg_token``, ``pos_embed``, ``norm_pre``,
``blocks[i].norm1 / attn.qkv / attn.q_norm / attn.k_norm / attn.proj / ls1 / norm2 /
mlp.fc1 / mlp.act / mlp.fc2 / ls2``, ``norm``, ``fc_norm``, ``head``. Attention uses the fused
``scaled_dot_product_attention`` kernel unless ``fused_attn`` is False, as in timm. The explicit path
(:func:`explicit_attention`) keeps logits and softmax in float32 even under autocast, as the fused kernel
does: with bfloat16 logits the attention output's error would be about twice the fused kernel's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TinyViTConfig:
    image_size: int = 64
    patch_size: int = 8
    embed_dim: int = 128
    depth: int = 6
    num_heads: int = 4
    mlp_ratio: float = 4.0
    num_classes: int = 0
    num_reg_tokens: int = 0
    global_pool: str = "token"  # "token" (CLS) or "avg" (mean of spatial tokens)
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


class PatchEmbed(nn.Module):
    """Conv patchifier returning NHWC ``[B, h, w, D]`` (timm's dynamic-size output format)."""

    def __init__(self, patch_size: int, embed_dim: int, image_size: int) -> None:
        super().__init__()
        self.patch_size = (patch_size, patch_size)
        self.img_size = (image_size, image_size)
        self.grid_size = (image_size // patch_size, image_size // patch_size)
        self.proj = nn.Conv2d(3, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).permute(0, 2, 3, 1)


def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                       dropout: nn.Module | None = None) -> torch.Tensor:
    """``softmax(q k^T * scale) v`` with logits and softmax in float32, also under autocast.

    Args:
        q, k, v: ``[B, heads, N, head_dim]``.
        scale: logit scale (``head_dim ** -0.5``).
        dropout: applied to the attention weights (training).

    Returns:
        ``[B, heads, N, head_dim]`` in ``v``'s dtype.
    """
    with torch.autocast(q.device.type, enabled=False):
        attn = (q.float() * scale) @ k.float().transpose(-2, -1)
        attn = attn.softmax(dim=-1)
        if dropout is not None:
            attn = dropout(attn)
        return (attn @ v.float()).to(v.dtype)


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.fused_attn = True
        self.qkv = nn.Linear(dim, dim * 3)
        self.q_norm = nn.Identity()
        self.k_norm = nn.Identity()
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)
        else:
            x = explicit_attention(q, k, v, self.scale, self.attn_drop)
        return self.proj_drop(self.proj(x.transpose(1, 2).reshape(b, n, c)))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads)
        self.ls1 = nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.ls2 = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x)))
        return x + self.ls2(self.mlp(self.norm2(x)))


class TinyViT(nn.Module):
    """A small ViT in timm's layout; ``forward`` returns logits (or pooled features without a head)."""

    dynamic_img_size = True  # timm's flag: other input sizes interpolate the position embeddings

    def __init__(self, config: TinyViTConfig = TinyViTConfig()) -> None:
        super().__init__()
        c = self.config = config
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(c.seed)
            self.patch_embed = PatchEmbed(c.patch_size, c.embed_dim, c.image_size)
            h, w = self.patch_embed.grid_size
            self.num_prefix_tokens = 1 + c.num_reg_tokens
            self.cls_token = nn.Parameter(torch.randn(1, 1, c.embed_dim) * 0.02)
            self.reg_token = None
            if c.num_reg_tokens:
                self.reg_token = nn.Parameter(torch.randn(1, c.num_reg_tokens, c.embed_dim) * 0.02)
            # Position embeddings cover CLS and the spatial tokens; registers get none (timm's convention).
            self.pos_embed = nn.Parameter(torch.randn(1, 1 + h * w, c.embed_dim) * 0.02)
            self.norm_pre = nn.Identity()
            self.blocks = nn.Sequential(*[Block(c.embed_dim, c.num_heads, c.mlp_ratio) for _ in range(c.depth)])
            self.norm = nn.LayerNorm(c.embed_dim, eps=1e-6)
            self.fc_norm = nn.Identity()
            self.global_pool = c.global_pool
            self.head = nn.Linear(c.embed_dim, c.num_classes) if c.num_classes else nn.Identity()

    def _pos_embed(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, h, w, D]`` -> ``[B, N, D]``: add (interpolated) position embeddings, prepend prefix tokens."""
        b, h, w, d = x.shape
        gh, gw = self.patch_embed.grid_size
        pos_cls, pos_spatial = self.pos_embed[:, :1], self.pos_embed[:, 1:]
        if (h, w) != (gh, gw):
            grid = pos_spatial.reshape(1, gh, gw, d).permute(0, 3, 1, 2)
            grid = F.interpolate(grid, size=(h, w), mode="bicubic", align_corners=False)
            pos_spatial = grid.permute(0, 2, 3, 1).reshape(1, h * w, d)
        x = x.reshape(b, h * w, d) + pos_spatial
        prefix = [(self.cls_token + pos_cls).expand(b, -1, -1)]
        if self.reg_token is not None:
            prefix.append(self.reg_token.expand(b, -1, -1))
        return torch.cat(prefix + [x], dim=1)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm_pre(self._pos_embed(self.patch_embed(x)))
        return self.norm(self.blocks(x))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = x[:, self.num_prefix_tokens:].mean(dim=1) if self.global_pool == "avg" else x[:, 0]
        x = self.fc_norm(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


@dataclass(frozen=True)
class TinyResNetConfig:
    image_size: int = 64
    widths: tuple[int, ...] = (32, 64, 128, 256)
    num_classes: int = 0
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class TinyResNet(nn.Module):
    """A four-stage ResNet for 64 px inputs: stem (stride 2), stages with strides 1, 2, 2, 2."""

    def __init__(self, config: TinyResNetConfig = TinyResNetConfig()) -> None:
        super().__init__()
        c = self.config = config
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(c.seed)
            self.stem = nn.Sequential(nn.Conv2d(3, c.widths[0], 3, 2, 1, bias=False), nn.BatchNorm2d(c.widths[0]),
                                      nn.ReLU())
            cin, stages = c.widths[0], []
            for i, width in enumerate(c.widths):
                stages.append(nn.Sequential(BasicBlock(cin, width, 1 if i == 0 else 2), BasicBlock(width, width, 1)))
                cin = width
            self.stages = nn.ModuleList(stages)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(cin, c.num_classes) if c.num_classes else nn.Identity()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for stage in self.stages:
            x = stage(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.forward_features(x)).flatten(1))
