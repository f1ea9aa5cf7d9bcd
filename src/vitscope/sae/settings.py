"""How a sparse autoencoder is trained: the settings recorded in its file (:class:`SAETraining`)."""

from __future__ import annotations

from dataclasses import dataclass

from vitscope.autoencoders.model import KINDS
from vitscope.autoencoders.tokens import TOKENS_OF
from vitscope.errors import VitscopeValueError

__all__ = ["SAETraining"]


@dataclass(frozen=True)
class SAETraining:
    """How an SAE is trained (recorded in its file under ``vitscope.training``).

    Attributes:
        kind, latents, k: the SAE (:class:`~vitscope.autoencoders.model.SparseAutoencoder`).
        tokens: tokens to train on (passes over the data repeat until they are seen, at most ``max_epochs``).
        buffer_tokens: the shuffle buffer of each process (None: sized from the memory free when the run starts, at
            most 2**22 tokens; a resume keeps the first run's size and the file records it under ``buffers``).
        batch_tokens: minibatch size (over all processes of a distributed run: each brings its share); lr: Adam's
            peak learning rate; l1: ``relu``'s sparsity coefficient.
        aux_k: dead latents asked to reconstruct the error (Gao et al.: 512, capped at half the latents);
        aux_coefficient: its weight (1/32); dead_after: tokens without firing that make a latent dead.
        tokens_of: ``spatial``, ``cls``, ``registers`` or ``all``.
        seed: of the initial weights, the data order and the buffer's shuffles; max_epochs: passes at most.
    """

    kind: str = "topk"
    latents: int = 4096
    k: int = 32
    tokens: int = 2_000_000
    buffer_tokens: int | None = None
    batch_tokens: int = 4096
    lr: float = 2e-4
    l1: float = 5.0
    aux_k: int = 512
    aux_coefficient: float = 1 / 32
    dead_after: int = 1_000_000
    tokens_of: str = "spatial"
    seed: int = 0
    max_epochs: int = 100

    def check(self) -> None:
        """Refuse settings no training can run with (one line)."""
        if self.kind not in KINDS:
            raise VitscopeValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.tokens_of not in TOKENS_OF:
            raise VitscopeValueError(f"tokens_of must be one of {', '.join(TOKENS_OF)}, got {self.tokens_of!r}")
        if min(self.latents, self.k, self.tokens, self.batch_tokens, self.max_epochs) < 1 or self.k > self.latents:
            raise VitscopeValueError("latents, k, tokens, batch_tokens and max_epochs must be positive, k <= latents")
        if self.buffer_tokens is not None and self.buffer_tokens < 2 * self.batch_tokens:
            raise VitscopeValueError(f"buffer_tokens must hold two minibatches ({2 * self.batch_tokens}), got "
                                     f"{self.buffer_tokens}")
