"""Masked-autoencoder pretraining (He et al.; paper 002's MAE model), small.

The encoder sees only the visible patches (plus CLS); a light decoder fills in mask tokens and
predicts the pixels of every patch; the loss is the mean squared error on the masked patches of the
per-patch normalised target (``norm_pix_loss``, MAE's default). The decoder is dropped after training.
The mask generator is a replaceable function, so guided masking (a later experiment) plugs in here.

Two options leave MAE for experiments (``docs/zoo-findings.md``, session 11): ``decoder_input="cls"`` lets
the decoder read only the CLS token (a global bottleneck like BEiT v2's, without its patch tokens), and
``target_pool`` predicts each patch at a coarser resolution.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vitscope.errors import VitscopeValueError
from vitscope.models.backbone import Backbone
from vitscope.models.tiny import Block
from vitscope.train.augment import random_resized_crop, swap_background
from vitscope.train.data import normalise
from vitscope.train.loop import Recipe, cosine_schedule
from vitscope.train.supervised import decay_groups

__all__ = ["MAEConfig", "MAEDecoder", "MAERecipe", "patchify", "pooled_patches", "random_mask"]

# (batch, number of patches, number to keep, generator) -> ids_keep [B, keep] (the visible patches)
MaskFn = Callable[[int, int, int, torch.Generator], torch.Tensor]


@dataclass(frozen=True)
class MAEConfig:
    """Hyper-parameters of MAE pretraining.

    Attributes:
        mask_ratio: fraction of patches hidden from the encoder, in ``(0, 1)``; at least one patch is hidden
            and one seen, however the fraction rounds.
        decoder_dim, decoder_depth, decoder_heads: the light decoder.
        lr, weight_decay, warmup: AdamW (betas 0.9, 0.95) with cosine decay.
        norm_pix_loss: normalise each target patch by its mean and variance.
        crop_scale: area range of the random resized crop.
        foreground_loss: weight each masked patch's error by the fraction of its pixels inside the
            foreground (the training set's object masks, cropped with the image), so that the encoder is
            not paid to memorise background textures; needs ``TensorImages.foreground``. False (the
            default) is MAE's loss.
        background_swap: probability that an image's background is replaced by another batch image's
            before cropping (:func:`~vitscope.train.augment.swap_background`); with ``foreground_loss`` the
            background is then unrelated to the object and unpredictable, so nothing rewards encoding it.
            Needs ``TensorImages.foreground``.
        decoder_input: ``"tokens"`` (MAE): the decoder reads the encoded visible patches and the prefix
            tokens; ``"cls"``: the CLS token alone (no registers, no patch), so everything it reconstructs
            must pass through it. Not MAE; an experiment (BEiT v2's CLS bottleneck without its patch tokens).
        target_pool: each target patch is average-pooled in ``target_pool x target_pool`` cells first (1:
            every pixel, MAE; the patch size: its mean colour, which ``norm_pix_loss`` reduces to its
            direction about grey, i.e. its hue, amplifying near-grey patches). Must divide the patch size.
        seed: initialises the decoder.
        mask_seed: None (MAE): the masks are drawn from the training loop's generator, after the crop's
            draws; an integer: each step's masks come from a generator of their own seeded by
            ``(mask_seed, step)``, so the crops and flips the loop's generator draws do not depend on how much
            randomness the mask function uses (twins with different mask functions see the same images).
    """

    mask_ratio: float = 0.75
    decoder_dim: int = 64
    decoder_depth: int = 2
    decoder_heads: int = 4
    lr: float = 1.5e-3
    weight_decay: float = 0.05
    warmup: int = 200
    norm_pix_loss: bool = True
    crop_scale: tuple[float, float] = (0.2, 1.0)
    foreground_loss: bool = False
    background_swap: float = 0.0
    decoder_input: Literal["tokens", "cls"] = "tokens"
    target_pool: int = 1
    seed: int = 0
    mask_seed: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.mask_ratio < 1.0:  # 0 hides nothing: the loss over hidden patches is 0 and nothing learns
            raise VitscopeValueError(f"mask_ratio must be in (0, 1), got {self.mask_ratio}")
        if self.decoder_input not in ("tokens", "cls"):
            raise VitscopeValueError(f"decoder_input must be 'tokens' or 'cls', got '{self.decoder_input}'")
        if self.target_pool < 1:
            raise VitscopeValueError(f"target_pool must be at least 1, got {self.target_pool}")


def patchify(images: torch.Tensor, patch: int) -> torch.Tensor:
    """``[B, C, H, W]`` -> ``[B, h*w, patch*patch*C]`` in the patch embedding's row-major token order."""
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(b, (h // patch) * (w // patch), patch * patch * c)


def _check_pool(patch: int, pool: int, name: str) -> None:
    if pool < 1 or patch % pool:
        raise VitscopeValueError(f"{name} {pool} does not divide the patch size {patch}")


def pooled_patches(images: torch.Tensor, patch: int, pool: int) -> torch.Tensor:
    """Patches average-pooled in ``pool x pool`` cells, in :func:`patchify`'s token and value order.

    Args:
        images: ``[B, C, H, W]``, sides multiples of ``patch``.
        patch: patch side in pixels.
        pool: cell side in pixels; divides ``patch``. 1 is :func:`patchify`, ``patch`` each patch's mean colour.

    Returns:
        ``[B, h*w, (patch/pool)**2 * C]``.

    Raises:
        ValueError: if ``pool`` does not divide ``patch``.
    """
    _check_pool(patch, pool, "pool")
    return patchify(F.avg_pool2d(images, pool), patch // pool) if pool > 1 else patchify(images, patch)


def random_mask(batch: int, num_patches: int, keep: int, gen: torch.Generator) -> torch.Tensor:
    """MAE's uniform random masking: the ``keep`` patches with the smallest uniform noise stay visible."""
    noise = torch.rand(batch, num_patches, generator=gen)
    return noise.argsort(dim=1)[:, :keep]


def _sincos_2d(dim: int, h: int, w: int) -> torch.Tensor:
    """Fixed 2-D sine-cosine position embedding ``[h*w, dim]`` (MAE's decoder positions)."""
    def one_axis(d: int, pos: np.ndarray) -> np.ndarray:
        omega = 1.0 / 10000 ** (np.arange(d // 2, dtype=np.float64) / (d / 2))
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    gy, gx = np.meshgrid(np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64), indexing="ij")
    emb = np.concatenate([one_axis(dim // 2, gy), one_axis(dim // 2, gx)], axis=1)
    return torch.from_numpy(emb).float()


class MAEDecoder(nn.Module):
    """Mask tokens + fixed positions + a few transformer blocks + a linear pixel predictor.

    Args:
        embed_dim: width of the encoder's tokens.
        grid: ``(h, w)`` patch grid.
        patch: patch side in pixels.
        dim, depth, heads: the decoder's width, blocks and heads.
        seed: initialises the decoder (its draws never touch the global generator).
        out_patch: side of each predicted patch (default ``patch``; smaller for pooled targets).
    """

    def __init__(self, embed_dim: int, grid: tuple[int, int], patch: int, dim: int, depth: int, heads: int,
                 seed: int = 0, out_patch: int | None = None) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embed = nn.Linear(embed_dim, dim)
            self.mask_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
            self.register_buffer("pos_embed", _sincos_2d(dim, *grid).unsqueeze(0), persistent=False)
            self.blocks = nn.Sequential(*[Block(dim, heads, 4.0) for _ in range(depth)])
            self.norm = nn.LayerNorm(dim, eps=1e-6)
            out_patch = patch if out_patch is None else out_patch
            self.pred = nn.Linear(dim, out_patch * out_patch * 3)

    def forward(self, latent: torch.Tensor, ids_keep: torch.Tensor, num_patches: int, num_prefix: int) -> torch.Tensor:
        """``latent [B, P+keep, D]`` (prefix first) -> predicted patches ``[B, num_patches, out_patch**2 * 3]``.

        With ``keep`` 0 (``ids_keep [B, 0]``) the decoder sees the prefix tokens alone.
        """
        x = self.embed(latent)
        prefix, visible = x[:, :num_prefix], x[:, num_prefix:]
        b, _, d = visible.shape
        full = self.mask_token.to(visible.dtype).expand(b, num_patches, d).clone()
        full.scatter_(1, ids_keep.unsqueeze(-1).expand(-1, -1, d), visible)
        x = torch.cat([prefix, full + self.pos_embed], dim=1)
        return self.pred(self.norm(self.blocks(x)))[:, num_prefix:]


class MAERecipe(Recipe):
    """Masked-autoencoder pretraining of a tiny ViT (timm layout).

    Args:
        backbone: a wrapped tiny ViT (its head, if any, is not trained).
        config: hyper-parameters.
        mask_fn: chooses the visible patches (default: uniform random, as MAE).
    """

    name = "mae"

    def __init__(self, backbone: Backbone, config: MAEConfig = MAEConfig(), mask_fn: MaskFn = random_mask) -> None:
        self._backbone, self.config, self.mask_fn = backbone, config, mask_fn
        self.model = backbone.model
        spec = backbone.spec
        self.patch = spec.patch_size
        if config.decoder_input == "cls" and spec.prefix_kinds[:1] != ("cls",):  # timm layout: CLS first
            raise VitscopeValueError("decoder_input='cls' needs a model with a CLS token")
        _check_pool(self.patch, config.target_pool, "target_pool")  # at construction, not at the first step
        self.decoder = MAEDecoder(spec.embed_dim, spec.grid, self.patch, config.decoder_dim, config.decoder_depth,
                                  config.decoder_heads, config.seed, out_patch=self.patch // config.target_pool)
        self.needs_foreground = config.foreground_loss or config.background_swap > 0

    def modules(self) -> dict[str, nn.Module]:
        return {"model": self.model, "decoder": self.decoder}

    def optimizer(self) -> torch.optim.Optimizer:
        groups = decay_groups(self.model, self.config.weight_decay) + decay_groups(self.decoder,
                                                                                   self.config.weight_decay)
        return torch.optim.AdamW(groups, lr=self.config.lr, betas=(0.9, 0.95))

    def scheduler(self, optimizer, steps):
        return cosine_schedule(optimizer, steps, min(self.config.warmup, steps // 5 + 1))

    def mask_generator(self, step: int, gen: torch.Generator) -> torch.Generator:
        """The generator the masks of step ``step`` draw from: ``gen`` (the loop's), or their own (``mask_seed``).

        The seed is taken modulo 2**64 (torch's range), so any integer works; resumed runs need no saved state.
        """
        if self.config.mask_seed is None:
            return gen
        return torch.Generator().manual_seed((self.config.mask_seed * 1_000_003 + step) % 2**64)

    def settings(self) -> dict[str, Any]:
        fn = self.mask_fn  # a function, or an object with a __call__ (GuidedMaskFn)
        name = getattr(fn, "__qualname__", type(fn).__qualname__)
        return {**super().settings(), "mask_fn": f"{getattr(fn, '__module__', '')}.{name}"}

    def encode_visible(self, pixels: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode a random visible subset of patches.

        Returns:
            latent ``[B, P+keep, D]`` (prefix tokens first) and ids_keep ``[B, keep]``.
        """
        m = self.model
        tokens = m._pos_embed(m.patch_embed(pixels))  # [B, P+L, D], positions added
        prefix_n = m.num_prefix_tokens
        prefix, spatial = tokens[:, :prefix_n], tokens[:, prefix_n:]
        b, n, d = spatial.shape
        keep = min(n - 1, max(1, round(n * (1 - self.config.mask_ratio))))  # one patch hidden at least, one seen
        ids_keep = self.mask_fn(b, n, keep, gen).to(pixels.device)
        visible = torch.gather(spatial, 1, ids_keep.unsqueeze(-1).expand(-1, -1, d))
        latent = m.norm(m.blocks(m.norm_pre(torch.cat([prefix, visible], dim=1))))
        return latent, ids_keep

    def loss(self, images: torch.Tensor, labels: torch.Tensor, step: int, gen: torch.Generator,
             foreground: torch.Tensor | None = None) -> torch.Tensor:
        spec = self._backbone.spec
        x = images.float() / 255.0
        if self.needs_foreground:
            foreground = self.require_foreground(foreground)
            if self.config.background_swap > 0:
                x = swap_background(x, foreground, gen, p=self.config.background_swap)
            x = torch.cat([x, foreground.unsqueeze(1).to(x.dtype)], dim=1)  # cropped with the image
        x = random_resized_crop(x, spec.image_size[0], self.config.crop_scale, gen)
        x, fg = x[:, :3], x[:, 3:]
        x = normalise(x, spec.mean, spec.std)
        latent, ids_keep = self.encode_visible(x, self.mask_generator(step, gen))
        target = pooled_patches(x, self.patch, self.config.target_pool)
        if self.config.decoder_input == "cls":  # no visible patch, no register: the CLS is the bottleneck
            pred = self.decoder(latent[:, :1], ids_keep[:, :0], target.shape[1], 1)
        else:
            pred = self.decoder(latent, ids_keep, target.shape[1], self.model.num_prefix_tokens)
        if self.config.norm_pix_loss:
            mean, var = target.mean(-1, keepdim=True), target.var(-1, keepdim=True)
            target = (target - mean) / (var + 1e-6).sqrt()
        per_patch = ((pred - target) ** 2).mean(-1)  # [B, L]
        masked = torch.ones_like(per_patch)
        masked.scatter_(1, ids_keep, 0.0)
        if self.config.foreground_loss:
            masked = masked * patchify(fg, self.patch).mean(-1)  # foreground fraction of each patch
        return (per_patch * masked).sum() / masked.sum().clamp_min(1e-6)

    def backbone(self) -> Backbone:
        return self._backbone
