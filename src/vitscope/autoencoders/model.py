"""Sparse autoencoders over a model's activations: ``x -> codes -> x_hat`` with a few active codes per token.

Written here rather than taken from a library: overcomplete needs timm and torchvision (which cannot be imported
beside vitscope's torch), dictionary_learning pins nnsight below 0.4 and pulls wandb and umap, and SAELens pulls
TransformerLens; the modules themselves are a few lines. Files are written and read in SAELens's layout
(:mod:`vitscope.autoencoders.files`), so those tools and vitscope read each other's weights.

Parameters follow SAELens's names and shapes: ``W_enc [d_in, d_sae]``, ``b_enc [d_sae]``, ``W_dec [d_sae, d_in]``,
``b_dec [d_in]``; the decoder bias is subtracted from the input before encoding (SAELens's
``apply_b_dec_to_input``). Inputs are multiplied by ``scale`` first (vitscope's input normalisation: the factor that
gives the training tokens a mean squared norm of ``d_in``) and reconstructions divided by it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vitscope.errors import VitscopeValueError

__all__ = ["KINDS", "LOADED_KINDS", "SparseAutoencoder"]

#: ``relu`` (L1 penalty, the classic baseline), ``topk`` (k codes per token), ``batchtopk`` (k per token on average
#: over a batch; a learned threshold at inference), ``matryoshka`` (batch top-k whose nested prefixes of the
#: dictionary each reconstruct alone)
KINDS = ("relu", "topk", "batchtopk", "matryoshka")
#: kinds a loaded file may have besides: ``jumprelu`` (a threshold per latent, e.g. SAELens's JumpReLU SAEs)
LOADED_KINDS = (*KINDS, "jumprelu")


class SparseAutoencoder(nn.Module):
    """A sparse autoencoder of ``d_in``-dimensional activations with ``d_sae`` latents.

    Args:
        d_in: activation width; d_sae: number of latents.
        kind: one of :data:`KINDS` (or ``jumprelu``, for weights loaded from elsewhere).
        k: active latents per token (``topk``; the batch average for ``batchtopk`` and ``matryoshka``).
        widths: ``matryoshka``: the nested dictionary sizes, increasing, the last equal to ``d_sae`` (default
            ``d_sae / 16, / 4, / 1``).
        seed: of the initial weights (decoder rows of unit norm, the encoder their transpose).
        b_dec_in_input: subtract the decoder bias from the input before encoding (SAELens's
            ``apply_b_dec_to_input``; files saved without it load with it off).
        token_norm: ``"layer_norm"`` normalises every token to zero mean and unit standard deviation before
            encoding and :meth:`forward` puts the reconstruction back in its units (ViT-Prisma's default); None: only
            the constant ``scale``.
    """

    def __init__(self, d_in: int, d_sae: int, kind: str = "topk", k: int = 32, widths: Sequence[int] | None = None,
                 seed: int = 0, b_dec_in_input: bool = True, token_norm: str | None = None) -> None:
        super().__init__()
        if token_norm not in (None, "layer_norm"):
            raise VitscopeValueError(f"token_norm must be None or 'layer_norm', got {token_norm!r}")
        self.token_norm = token_norm
        if kind not in LOADED_KINDS:
            raise VitscopeValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        self.b_dec_in_input = bool(b_dec_in_input)
        if d_in < 1 or d_sae < 1 or not 1 <= k <= d_sae:
            raise VitscopeValueError(f"need d_in >= 1, d_sae >= 1 and 1 <= k <= d_sae, got {d_in}, {d_sae}, {k}")
        self.d_in, self.d_sae, self.kind, self.k = int(d_in), int(d_sae), kind, int(k)
        default = [max(1, d_sae // 16), max(1, d_sae // 4), d_sae]
        self.widths = sorted(set(int(w) for w in (widths or default))) if kind == "matryoshka" else [d_sae]
        if self.widths[-1] != d_sae or self.widths[0] < 1:
            raise VitscopeValueError(f"matryoshka widths must be positive and end at d_sae={d_sae}, got {widths}")
        gen = torch.Generator().manual_seed(int(seed))
        w_dec = torch.randn(d_sae, d_in, generator=gen)
        w_dec = w_dec / w_dec.norm(dim=1, keepdim=True)
        self.W_dec = nn.Parameter(w_dec)
        self.W_enc = nn.Parameter(w_dec.T.clone())
        self.b_enc = nn.Parameter(torch.zeros(d_sae))
        self.b_dec = nn.Parameter(torch.zeros(d_in))
        self.register_buffer("scale", torch.ones(()))
        # JumpReLU threshold per latent: batch top-k's inference rule (and SAELens's jumprelu files)
        self.register_buffer("threshold", torch.zeros(d_sae))

    def _normalised(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``x`` as the encoder reads it, and the per-token mean and deviation that undo it (None: no token norm)."""
        if self.token_norm != "layer_norm":
            return x, None, None
        mean, std = x.mean(dim=-1, keepdim=True), x.std(dim=-1, keepdim=True)
        return (x - mean) / (std + 1e-5), mean, std

    def pre_activations(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., d_in]`` -> ``[..., d_sae]`` before the sparsifying non-linearity."""
        x = self._normalised(x)[0] * self.scale
        return (x - self.b_dec if self.b_dec_in_input else x) @ self.W_enc + self.b_enc

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Codes of ``x [..., d_in]``: ``[..., d_sae]`` (inference rule: per token, never across a batch)."""
        z = self.pre_activations(x)
        if self.kind == "relu":
            return z.relu()
        if self.kind == "topk":
            return _topk(z, self.k)
        return z.relu() * (z > self.threshold)

    def encode_batch(self, x: torch.Tensor) -> torch.Tensor:
        """Training codes of a batch ``[n, d_in]``: batch top-k keeps the ``k * n`` largest over the whole batch;
        the other kinds as :meth:`encode`."""
        if self.kind not in ("batchtopk", "matryoshka"):
            return self.encode(x)
        z = self.pre_activations(x).relu()
        flat = z.flatten()
        keep = torch.topk(flat, min(self.k * x.shape[0], flat.numel()), sorted=False).indices
        return torch.zeros_like(flat).scatter(0, keep, flat[keep]).reshape(z.shape)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``[..., d_sae]`` -> ``[..., d_in]`` in the input's units."""
        return (codes @ self.W_dec + self.b_dec) / self.scale

    def reconstruct(self, codes: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``decode(codes)`` in the units of the tokens ``x`` they came from (a per-token norm undone)."""
        x_hat = self.decode(codes)
        _, mean, std = self._normalised(x)
        return x_hat if mean is None else x_hat * (std + 1e-5) + mean

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The reconstruction of ``x [..., d_in]`` (in ``x``'s units, a token norm undone)."""
        return self.reconstruct(self.encode(x), x)

    def encoder_direction(self, latent: int) -> torch.Tensor:
        """The input direction latent ``latent`` reads, its encoder column: ``[d_in]`` (the constant input scale,
        a positive factor, leaves the direction as it is)."""
        if not 0 <= latent < self.d_sae:
            raise VitscopeValueError(f"latent {latent} does not exist ({self.d_sae} latents)")
        return self.W_enc[:, latent].detach().float().cpu()

    @torch.no_grad()
    def normalise_decoder(self) -> None:
        """Decoder rows back to unit norm (after an optimiser step)."""
        self.W_dec.div_(self.W_dec.norm(dim=1, keepdim=True).clamp_min(1e-12))

    def folded(self) -> dict[str, torch.Tensor]:
        """The weights with ``scale`` folded in (input and output in the activations' own units, the codes
        unchanged): what other tools read, which know no vitscope scale."""
        s = self.scale.detach()
        return {"W_enc": (self.W_enc.detach() * s).contiguous(), "b_enc": self.b_enc.detach().clone(),
                "W_dec": (self.W_dec.detach() / s).contiguous(), "b_dec": (self.b_dec.detach() / s).contiguous(),
                "threshold": self.threshold.detach().clone()}


def _topk(z: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the ``k`` largest pre-activations of every token, rectified; zero the rest."""
    values, index = torch.topk(z, k, dim=-1, sorted=False)
    return torch.zeros_like(z).scatter(-1, index, values.relu())
