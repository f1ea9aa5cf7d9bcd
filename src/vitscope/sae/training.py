"""Training a sparse autoencoder from the stream of a model's activations, without writing them anywhere.

Each pass over the data (an epoch, its order shuffled by the seed) is one :func:`vitscope.run`; the hook's tokens go
into an in-memory shuffle buffer, and whenever the buffer is full the SAE trains on a random half of it in
minibatches, the other half staying to mix with the next tokens. Memory is the buffer plus the model, whatever the
data's size.

Standard practice, as in the SAE literature and SAELens: inputs scaled so that the first buffer's tokens have a mean
squared norm of ``d_in`` (recorded in the file), the decoder bias started at the geometric median of the first
buffer, decoder rows of unit norm after every step, Adam with a linear warm-up (the first 5 % of the steps) and a
linear decay to zero (the last 20 %), and against dead latents (none firing for ``dead_after`` tokens) Gao et al.
2024's auxiliary loss, which asks the ``aux_k`` dead latents closest to firing to reconstruct the error. Losses:
``relu`` the squared error plus ``l1`` times the codes' L1 norm; ``topk`` and ``batchtopk`` the squared error (batch
top-k also learns its inference threshold, the running mean of the smallest kept activation, as SAELens);
``matryoshka`` the mean of the squared errors of every nested prefix of the dictionary (Bussmann et al. 2025).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from vitscope.analyses.base import Analysis, Batch
from vitscope.atomic import atomic_path
from vitscope.autoencoders.files import save
from vitscope.autoencoders.model import KINDS, SparseAutoencoder
from vitscope.autoencoders.tokens import TOKENS_OF, selected_tokens
from vitscope.data.open import as_source
from vitscope.data.source_part import SourcePart
from vitscope.engine.memory import available_bytes
from vitscope.engine.run import resolve_device, run
from vitscope.errors import VitscopeValueError
from vitscope.models.backbone import Backbone

__all__ = ["SAETraining", "train"]

@dataclass(frozen=True)
class SAETraining:
    """How an SAE is trained (recorded in its file under ``vitscope.training``).

    Attributes:
        kind, latents, k: the SAE (:class:`~vitscope.autoencoders.model.SparseAutoencoder`).
        tokens: tokens to train on (passes over the data repeat until they are seen, at most ``max_epochs``).
        buffer_tokens: the shuffle buffer (None: sized from free memory, at most 2**22 tokens).
        batch_tokens: minibatch size; lr: Adam's peak learning rate; l1: ``relu``'s sparsity coefficient.
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
        if self.kind not in KINDS:
            raise VitscopeValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.tokens_of not in TOKENS_OF:
            raise VitscopeValueError(f"tokens_of must be one of {', '.join(TOKENS_OF)}, got {self.tokens_of!r}")
        if min(self.latents, self.k, self.tokens, self.batch_tokens, self.max_epochs) < 1 or self.k > self.latents:
            raise VitscopeValueError("latents, k, tokens, batch_tokens and max_epochs must be positive, k <= latents")
        if self.buffer_tokens is not None and self.buffer_tokens < 2 * self.batch_tokens:
            raise VitscopeValueError(f"buffer_tokens must hold two minibatches ({2 * self.batch_tokens}), got "
                                     f"{self.buffer_tokens}")


def _geometric_median(x: torch.Tensor, steps: int = 50) -> torch.Tensor:
    """Weiszfeld's iterations from the mean: ``[n, D]`` -> ``[D]``."""
    y = x.mean(dim=0)
    for _ in range(steps):
        w = 1.0 / (x - y).norm(dim=1).clamp_min(1e-8)
        y = (w[:, None] * x).sum(dim=0) / w.sum()
    return y


class _Trainer:
    """The SAE, its optimiser and schedule, fed from the buffer."""

    def __init__(self, d_in: int, cfg: SAETraining, device: torch.device, buffer: int) -> None:
        self.cfg = cfg
        self.sae = SparseAutoencoder(d_in, cfg.latents, kind=cfg.kind, k=cfg.k, seed=cfg.seed).to(device)
        self.opt = torch.optim.Adam(self.sae.parameters(), lr=cfg.lr, betas=(0.9, 0.999))
        self.steps = max(1, math.ceil(cfg.tokens / cfg.batch_tokens))
        self.step = 0
        self.seen = 0
        self.since_fired = torch.zeros(cfg.latents, dtype=torch.long, device=device)
        self.buffer = torch.empty(buffer, d_in, device=device)
        self.filled = 0
        self.started = False
        self.gen = torch.Generator(device="cpu").manual_seed(cfg.seed + 1)
        self.log: list[dict[str, float]] = []

    @property
    def done(self) -> bool:
        return self.step >= self.steps

    def state(self) -> dict[str, Any]:
        """What an epoch boundary leaves (the buffer is empty then): weights, optimiser, counters, random state."""
        return {"sae": self.sae.state_dict(), "opt": self.opt.state_dict(), "step": self.step, "seen": self.seen,
                "since_fired": self.since_fired.cpu(), "gen": self.gen.get_state(), "started": self.started,
                "log": [[e[k] for k in _LOG_KEYS] for e in self.log]}

    def restore(self, state: dict[str, Any]) -> None:
        self.sae.load_state_dict(state["sae"])
        self.opt.load_state_dict(state["opt"])
        self.step, self.seen, self.started = int(state["step"]), int(state["seen"]), bool(state["started"])
        self.since_fired = state["since_fired"].to(self.since_fired.device)
        self.gen.set_state(state["gen"])
        self.log = [dict(zip(_LOG_KEYS, e)) for e in state["log"]]

    def push(self, tokens: torch.Tensor) -> None:
        """Add tokens ``[n, D]``; train whenever the buffer is full."""
        start = 0
        while start < len(tokens) and not self.done:
            take = min(len(tokens) - start, len(self.buffer) - self.filled)
            self.buffer[self.filled : self.filled + take].copy_(tokens[start : start + take])
            self.filled += take
            start += take
            if self.filled == len(self.buffer):
                self.train_on(len(self.buffer) // 2)

    def finish(self) -> None:
        """Train on the whole minibatches the buffer still holds at the end of a pass, and empty it (so that a pass
        ends in a state that is all weights and counters)."""
        whole = self.filled - self.filled % self.cfg.batch_tokens
        if whole and not self.done:
            self.train_on(whole)
        self.filled = 0

    def train_on(self, count: int) -> None:
        """Train on ``count`` random tokens of the buffer in minibatches and drop them from it."""
        with torch.inference_mode(False), torch.enable_grad():
            if not self.started:
                self._start(self.buffer[: self.filled].clone())
            order = torch.randperm(self.filled, generator=self.gen).to(self.buffer.device)
            chosen, kept = order[:count], order[count:]
            tokens = self.buffer[chosen].clone()
            self.buffer[: len(kept)] = self.buffer[kept].clone()
            self.filled = len(kept)
            for start in range(0, count - self.cfg.batch_tokens + 1, self.cfg.batch_tokens):
                if self.done:
                    break
                self._step(tokens[start : start + self.cfg.batch_tokens])

    def _start(self, first: torch.Tensor) -> None:
        """Input scale and decoder bias from the first buffer."""
        with torch.no_grad():
            scale = math.sqrt(first.shape[1] / float((first.double() ** 2).sum(dim=1).mean().clamp_min(1e-12)))
            self.sae.scale.fill_(scale)
            self.sae.b_dec.copy_(_geometric_median(first[:65536] * scale))
        self.started = True

    def _lr(self) -> float:
        warm, decay = max(1, self.steps // 20), max(1, self.steps // 5)
        if self.step < warm:
            return self.cfg.lr * (self.step + 1) / warm
        if self.step >= self.steps - decay:
            return self.cfg.lr * (self.steps - self.step) / decay
        return self.cfg.lr

    def _step(self, x: torch.Tensor) -> None:
        sae, cfg = self.sae, self.cfg
        for group in self.opt.param_groups:
            group["lr"] = self._lr()
        xs = x * sae.scale  # in the SAE's units: losses do not depend on the activations' size
        codes = sae.encode_batch(x)
        recon = codes @ sae.W_dec + sae.b_dec
        loss = self._reconstruction(xs, codes, recon)
        if cfg.kind == "relu":
            loss = loss + cfg.l1 * codes.abs().sum(dim=1).mean() / xs.shape[1]
        aux = self._aux(xs, recon, x)
        loss = loss + cfg.aux_coefficient * aux
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        sae.normalise_decoder()
        with torch.no_grad():
            fired = (codes > 0).any(dim=0)
            self.since_fired = torch.where(fired, torch.zeros_like(self.since_fired), self.since_fired + len(x))
            if cfg.kind in ("batchtopk", "matryoshka"):
                positive = torch.where(codes > 0, codes, torch.full_like(codes, float("inf"))).amin()
                if torch.isfinite(positive):
                    sae.threshold.mul_(0.99).add_(0.01 * positive)
        self.step += 1
        self.seen += len(x)
        if self.step % max(1, self.steps // 20) == 0 or self.done:
            with torch.no_grad():
                fvu = float(((xs - recon) ** 2).sum() / ((xs - xs.mean(dim=0)) ** 2).sum().clamp_min(1e-12))
            self.log.append({"step": self.step, "tokens": self.seen, "loss": float(loss.detach()), "fvu": fvu,
                             "l0": float((codes > 0).sum(dim=1).double().mean()),
                             "dead": int((self.since_fired >= cfg.dead_after).sum())})

    def _reconstruction(self, xs: torch.Tensor, codes: torch.Tensor, recon: torch.Tensor) -> torch.Tensor:
        if self.cfg.kind != "matryoshka":
            return ((xs - recon) ** 2).sum(dim=1).mean() / xs.shape[1]
        losses = []
        for width in self.sae.widths:
            part = codes[:, :width] @ self.sae.W_dec[:width] + self.sae.b_dec
            losses.append(((xs - part) ** 2).sum(dim=1).mean() / xs.shape[1])
        return torch.stack(losses).mean()

    def _aux(self, xs: torch.Tensor, recon: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Gao et al. 2024's AuxK: the dead latents' top ``aux_k`` codes reconstruct the error (normalised)."""
        dead = self.since_fired >= self.cfg.dead_after
        k = min(self.cfg.aux_k, self.cfg.latents // 2, int(dead.sum()))
        if self.cfg.kind == "relu" or k < 1:
            return xs.new_zeros(())
        pre = self.sae.pre_activations(x).relu()
        pre = torch.where(dead, pre, torch.zeros_like(pre))
        values, index = torch.topk(pre, k, dim=1)
        aux_codes = torch.zeros_like(pre).scatter(1, index, values)
        error = (xs - recon).detach()
        guess = aux_codes @ self.sae.W_dec
        return ((error - guess) ** 2).sum(dim=1).mean() / (error ** 2).sum(dim=1).mean().clamp_min(1e-12)


_LOG_KEYS = ("step", "tokens", "loss", "fvu", "l0", "dead")


class _Stream(Analysis):
    """The tokens of one hook, handed to the trainer as the pass makes them (nothing kept: no declared state but
    the count of images seen)."""

    name = "sae_stream"

    def __init__(self, hook: str, tokens_of: str, feed: Callable[[torch.Tensor], None]) -> None:
        super().__init__()
        self.hook, self.tokens_of, self.feed = hook, tokens_of, feed
        self.add_state("num_images", 0, reduce="sum")

    def required_hooks(self, spec: Any) -> list[str]:
        return [self.hook]

    def stream_hooks(self, spec: Any) -> list[str]:
        return [self.hook]

    def update_hook(self, name: str, tensor: torch.Tensor, batch: Batch) -> None:
        if tensor.dim() == 4 and not batch.spec.is_transformer:  # a CNN map: every position is a token
            tensor = tensor.flatten(2).transpose(1, 2)
        self.feed(selected_tokens(tensor.detach().float(), tuple(batch.spec.prefix_kinds), self.tokens_of))

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        self.num_images += batch.size

    def compute(self) -> Any:
        return {"num_images": self.num_images}


def _buffer_size(cfg: SAETraining, d_in: int, device: torch.device) -> int:
    if cfg.buffer_tokens is not None:
        return int(cfg.buffer_tokens)
    free = available_bytes(str(device)) or 2**31
    fit = int(free // 8 // (4 * d_in))  # an eighth of free memory
    return max(2 * cfg.batch_tokens, min(fit, 2**22))


def _state_key(backbone: Backbone, hook: str, source: Any, config: SAETraining, batch_size: int) -> str:
    """What a saved training state must match to be resumed (the model's weights, the data, the settings)."""
    from vitscope.models.digest import model_fingerprint
    from vitscope.strict_json import dumps

    return dumps({"model": model_fingerprint(backbone), "hook": hook, "data": source.fingerprint(),
                  "config": asdict(config), "batch_size": batch_size})


def _saved(folder: Path | None, key: str) -> dict[str, Any] | None:
    """The training state saved in ``folder`` at an epoch's end for the same run, else None."""
    path = None if folder is None else folder / _STATE_FILE
    if path is None or not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # a torn or foreign file: start over
        return None
    return state if state.get("key") == key else None


_STATE_FILE = "training_state.pt"


def train(backbone: Backbone, hook: str, data: Any, config: SAETraining = SAETraining(), out: str | Path | None = None,
          batch_size: int = 32, device: str | None = None, log: Callable[[str], None] | None = None,
          ) -> SparseAutoencoder:
    """Train a sparse autoencoder of ``hook``'s activations from passes over ``data`` (nothing written but the SAE).

    With ``out``, the state at the end of every pass (weights, optimiser, counters, random state: never a token)
    goes to ``out/.training/``: the same call after a kill continues from the last finished pass and gives the same
    weights as a run never stopped; the folder is removed when the SAE is written.

    Args:
        backbone: the model; hook: one canonical name (e.g. ``blocks.8.resid_post``).
        data: anything :func:`vitscope.run` reads.
        config: the training (:class:`SAETraining`).
        out: a folder to write the SAE to (SAELens's layout, :func:`vitscope.sae.save`), with the training record.
        batch_size: images per forward pass; device: where the model and the SAE run.
        log: receives a line per epoch.

    Returns:
        The trained SAE (``training_log``: its metrics along the way).

    Raises:
        ValueError: a bad configuration, or a hook the model does not have (one line).
    """
    config.check()
    if hook not in set(backbone.hook_names()):
        raise VitscopeValueError(f"{backbone.spec.name} has no hook {hook!r}: name one canonical hook, e.g. "
                                 f"blocks.{backbone.spec.num_blocks - 1}.resid_post")
    source = as_source(data)
    folder = None if out is None else Path(out) / ".training"
    key = _state_key(backbone, hook, source, config, batch_size) if folder is not None else ""
    saved = _saved(folder, key)
    trainer: _Trainer | None = None

    def make(d_in: int, where: torch.device) -> _Trainer:
        with torch.inference_mode(False):  # the pass runs in inference mode; the SAE's tensors must not
            return _Trainer(d_in, config, where, _buffer_size(config, d_in, where))

    def feed(tokens: torch.Tensor) -> None:
        nonlocal trainer
        if trainer is None:
            trainer = make(tokens.shape[1], tokens.device)
        trainer.push(tokens)

    first = 0
    if saved is not None:
        trainer = make(int(saved["d_in"]), resolve_device(device))  # where the pass will run, as the first run
        with torch.inference_mode(False):
            trainer.restore(saved["trainer"])
        first = int(saved["epoch"])
        if log:
            log(f"resumed after pass {first} ({trainer.seen} tokens)")
    order = torch.Generator().manual_seed(config.seed)
    for epoch in range(config.max_epochs):
        positions = torch.randperm(len(source), generator=order).tolist()
        if epoch < first:
            continue
        if trainer is not None and trainer.done:
            break
        run(backbone, SourcePart(source, positions, name=source.name), [_Stream(hook, config.tokens_of, feed)],
            batch_size=batch_size, device=device, progress=False, workers=0)
        if trainer is None:
            raise VitscopeValueError(f"no token of {hook!r} came from {source.name} ({config.tokens_of} tokens)")
        with torch.inference_mode(False):
            trainer.finish()
        if log and trainer.log:
            last = trainer.log[-1]
            log(f"epoch {epoch + 1}: {trainer.seen} tokens, step {trainer.step}/{trainer.steps}, FVU "
                f"{last['fvu']:.3f}, L0 {last['l0']:.1f}, dead {last['dead']}")
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            with atomic_path(folder / _STATE_FILE) as partial:
                torch.save({"key": key, "epoch": epoch + 1, "d_in": int(trainer.buffer.shape[1]),
                            "trainer": trainer.state()}, partial)
    sae = trainer.sae.eval()
    sae.hook, sae.model = hook, backbone.spec.name
    sae.training_log = list(trainer.log)
    if out is not None:
        save(sae, out, hook=hook, model=backbone.spec.name,
             extra={"training": {**asdict(config), "tokens_seen": trainer.seen, "steps": trainer.step,
                                 "log": trainer.log}})
        shutil.rmtree(folder, ignore_errors=True)
    return sae
