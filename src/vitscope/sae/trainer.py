"""The SAE, its optimiser and schedule, fed from a shuffle buffer; with several processes, one replica of them.

Alone, a full buffer trains on a random half of itself and the end of a pass on the whole minibatches left. With
several processes every training goes through a round (:mod:`vitscope.sae.distributed`): the replicas take the same
steps, each on its own tokens, with the gradients summed, and every statistic that steers the training (the input
scale and the decoder bias's start, the dead latents' counters, batch top-k's threshold, the logged metrics) is
reduced over the processes, so the replicas stay equal after every step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from vitscope.autoencoders.model import SparseAutoencoder
from vitscope.sae.distributed import Replicas, Round, local_shares, plan_round

if TYPE_CHECKING:
    from vitscope.sae.settings import SAETraining

__all__ = ["LOG_KEYS", "Trainer", "round_table"]

LOG_KEYS = ("step", "tokens", "loss", "fvu", "l0", "dead")


def _geometric_median(x: torch.Tensor, replicas: Replicas, steps: int = 50) -> torch.Tensor:
    """Weiszfeld's iterations from the mean, over every process's tokens: ``[n, D]`` (``n`` may be 0) -> ``[D]``."""

    def weighted(w: torch.Tensor) -> torch.Tensor:
        total = replicas.sum(torch.cat([(w[:, None] * x).sum(dim=0), w.sum()[None]]))
        return total[:-1] / total[-1]

    y = weighted(torch.ones(len(x), dtype=x.dtype, device=x.device))
    for _ in range(steps):
        y = weighted(1.0 / (x - y).norm(dim=1).clamp_min(1e-8))
    return y


def round_table(replicas: Replicas, filled: int, ended: bool, width: int) -> list[tuple[int, int, int]]:
    """Every process's buffer fill, whether its pass ended, and its token width (0: no token yet): one collective."""
    with torch.inference_mode(False):
        table = torch.zeros(replicas.world, 3, dtype=torch.int64)
        table[replicas.rank] = torch.tensor([filled, int(ended), width])
        return [tuple(int(v) for v in row) for row in replicas.sum(table).tolist()]


class Trainer:
    """The SAE, its optimiser and schedule, fed from the buffer (one replica among ``replicas.world``)."""

    def __init__(self, d_in: int, cfg: SAETraining, device: torch.device, buffer: int,
                 replicas: Replicas | None = None) -> None:
        self.cfg = cfg
        self.replicas = replicas or Replicas()
        self.shares = local_shares(cfg.batch_tokens, self.replicas.world)
        self.sae = SparseAutoencoder(d_in, cfg.latents, kind=cfg.kind, k=cfg.k, seed=cfg.seed).to(device)
        self.opt = torch.optim.Adam(self.sae.parameters(), lr=cfg.lr, betas=(0.9, 0.999))
        self.steps = max(1, math.ceil(cfg.tokens / cfg.batch_tokens))
        self.step = 0
        self.seen = 0
        self.since_fired = torch.zeros(cfg.latents, dtype=torch.long, device=device)
        self.buffer = torch.empty(buffer, d_in, device=device)
        self.filled = 0
        self.started = False
        #: tokens pushed that hold a NaN or an infinity (counted on the device: read once a pass)
        self.nonfinite = torch.zeros((), dtype=torch.long, device=device)
        # each process shuffles its own buffer: its own stream, from the seed and its rank
        self.gen = torch.Generator(device="cpu").manual_seed(cfg.seed + 1 + self.replicas.rank)
        self.log: list[dict[str, float]] = []

    @property
    def done(self) -> bool:
        return self.step >= self.steps

    def buffer_sizes(self) -> list[int]:
        """Every process's buffer, in tokens, in rank order (a collective: every process calls it)."""
        return [int(n) for n in self.replicas.gather(torch.tensor([len(self.buffer)], device=self.buffer.device))]

    def state(self) -> dict[str, Any]:
        """What a pass's end leaves (the buffers are empty then): weights, optimiser, counters, and the random state
        and buffer size of every process (a collective: every process calls it)."""
        gens = self.replicas.gather(self.gen.get_state())
        return {"sae": self.sae.state_dict(), "opt": self.opt.state_dict(), "step": self.step, "seen": self.seen,
                "since_fired": self.since_fired.cpu(), "gens": gens, "started": self.started,
                "buffers": self.buffer_sizes(), "log": [[e[k] for k in LOG_KEYS] for e in self.log]}

    def restore(self, state: dict[str, Any]) -> None:
        self.sae.load_state_dict(state["sae"])
        self.opt.load_state_dict(state["opt"])
        self.step, self.seen, self.started = int(state["step"]), int(state["seen"]), bool(state["started"])
        self.since_fired = state["since_fired"].to(self.since_fired.device)
        self.gen.set_state(state["gens"][self.replicas.rank])
        self.log = [dict(zip(LOG_KEYS, e)) for e in state["log"]]

    def push(self, tokens: torch.Tensor) -> None:
        """Add tokens ``[n, D]``; train whenever the buffer is full."""
        self.nonfinite += (~torch.isfinite(tokens)).any(dim=1).sum()
        start = 0
        while start < len(tokens) and not self.done:
            take = min(len(tokens) - start, len(self.buffer) - self.filled)
            self.buffer[self.filled : self.filled + take].copy_(tokens[start : start + take])
            self.filled += take
            start += take
            if self.filled == len(self.buffer):
                self.train_round(round_table(self.replicas, self.filled, False, self.buffer.shape[1]))

    def finish(self, table: list[tuple[int, int, int]] | None = None) -> None:
        """This process's part of the pass has ended: train on what the buffers hold, in rounds until every
        process's part has ended, and empty the buffer (so a pass ends in a state that is all weights and
        counters). ``table``: the first round's, when this process already took part in it."""
        while True:
            table = table or round_table(self.replicas, self.filled, True, self.buffer.shape[1])
            if self.train_round(table).final:
                return
            table = None

    def train_round(self, table: list[tuple[int, int, int]]) -> Round:
        """Take this process's tokens of the round out of the buffer and take the round's steps with them."""
        plan = plan_round([r[0] for r in table], [bool(r[1]) for r in table], self.shares, self.steps - self.step)
        with torch.inference_mode(False), torch.enable_grad():
            if plan.steps and not self.started:
                self._start(self.buffer[: self.filled])  # read only: no copy of the buffer
            rank, share = self.replicas.rank, self.shares[self.replicas.rank]
            tokens = self.buffer[:0]
            if plan.batches[rank] or (plan.taken[rank] and not plan.final):
                order = torch.randperm(self.filled, generator=self.gen).to(self.buffer.device)
                chosen, kept = order[: plan.taken[rank]], order[plan.taken[rank] :]
                tokens = self.buffer[chosen]  # indexing copies: what the memory holds beside the buffer
                self.buffer[: len(kept)] = self.buffer[kept]
            self.filled = 0 if plan.final else self.filled - plan.taken[rank]
            for i in range(plan.steps):
                mine = tokens[i * share : (i + 1) * share] if i < plan.batches[rank] else tokens[:0]
                self._step(mine, plan.tokens(i, self.shares))
        return plan

    def _start(self, first: torch.Tensor) -> None:
        """Input scale and decoder bias from the first buffer of every process."""
        with torch.no_grad():
            # one float64 copy, squared in place: the buffer is an eighth of the free memory
            squares = torch.stack([first.to(torch.double, copy=True).pow_(2).sum(),  # never the buffer itself
                                   torch.tensor(float(len(first)), dtype=torch.double, device=first.device)])
            squares = self.replicas.sum(squares)
            scale = math.sqrt(first.shape[1] / float((squares[0] / squares[1]).clamp_min(1e-12)))
            self.sae.scale.fill_(scale)
            self.sae.b_dec.copy_(_geometric_median(first[:65536] * scale, self.replicas))
        self.started = True

    def _lr(self) -> float:
        warm, decay = max(1, self.steps // 20), max(1, self.steps // 5)
        if self.step < warm:
            return self.cfg.lr * (self.step + 1) / warm
        if self.step >= self.steps - decay:
            return self.cfg.lr * (self.steps - self.step) / decay
        return self.cfg.lr

    def _step(self, x: torch.Tensor, total: int) -> None:
        """One optimiser step on this process's tokens ``x [m, D]`` (``m`` may be 0) of the ``total`` the replicas
        see: each loss is this process's mean weighted by ``m / total``, so the summed gradients are those of the
        mean over all of them."""
        sae, cfg, replicas = self.sae, self.cfg, self.replicas
        for group in self.opt.param_groups:
            group["lr"] = self._lr()
        weight = len(x) / total
        xs = x * sae.scale  # in the SAE's units: losses do not depend on the activations' size
        codes, recon, loss = x.new_zeros(0, cfg.latents), xs, xs.new_zeros(())
        if len(x):
            codes = sae.encode_batch(x)
            recon = codes @ sae.W_dec + sae.b_dec
            loss = self._reconstruction(xs, codes, recon)
            if cfg.kind == "relu":
                loss = loss + cfg.l1 * codes.abs().sum(dim=1).mean() / xs.shape[1]
            loss = loss * weight
        loss = loss + cfg.aux_coefficient * self._aux(xs, recon, x, weight)
        self.opt.zero_grad(set_to_none=True)
        if len(x):
            loss.backward()
        if replicas.world > 1:
            self._sum_gradients()
        self.opt.step()
        sae.normalise_decoder()
        self._count_firing(codes, total)
        self.step += 1
        self.seen += total
        if self.step % max(1, self.steps // 20) == 0 or self.done:
            self._record(xs, recon, codes, loss, total)

    def _sum_gradients(self) -> None:
        """Every replica's gradients summed (a process that brought no token adds zeros): one collective."""
        params = list(self.sae.parameters())
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])
        flat = self.replicas.sum(flat)
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad = g.view_as(p).clone()

    def _count_firing(self, codes: torch.Tensor, total: int) -> None:
        """The dead latents' counters, and batch top-k's threshold, from the codes of every process."""
        sae = self.sae
        with torch.no_grad():
            positive = torch.where(codes > 0, codes, torch.full_like(codes, float("inf"))).amin(dim=0) \
                if len(codes) else codes.new_full((codes.shape[1],), float("inf"))
            # one collective: latents that fired anywhere, and (negated) the smallest kept code anywhere
            both = self.replicas.max(torch.cat([(positive < float("inf")).to(codes.dtype), -positive.amin()[None]]))
            fired, smallest = both[:-1] > 0, -both[-1]
            self.since_fired = torch.where(fired, torch.zeros_like(self.since_fired), self.since_fired + total)
            if self.cfg.kind in ("batchtopk", "matryoshka") and torch.isfinite(smallest):
                # a moving average that starts at the first batch's value (from zero, a short run's threshold would
                # stay far below the codes it keeps: 0.28 of them after 16 steps), as dictionary_learning's BatchTopK
                started = sae.threshold > 0
                sae.threshold.copy_(torch.where(started, sae.threshold * 0.99 + 0.01 * smallest, smallest))

    def _record(self, xs: torch.Tensor, recon: torch.Tensor, codes: torch.Tensor, loss: torch.Tensor,
                total: int) -> None:
        """The training log's entry for this step, over every process's tokens."""
        with torch.no_grad():
            d = xs.shape[1]
            sums = torch.cat([xs.double().sum(dim=0), torch.stack([
                ((xs - recon) ** 2).double().sum(), (codes > 0).sum().double(), loss.detach().double()])])
            sums = self.replicas.sum(sums)
            mean = (sums[:d] / total).to(xs.dtype)
            spread = float(self.replicas.sum(((xs - mean) ** 2).double().sum()[None])[0])
        self.log.append({"step": self.step, "tokens": self.seen, "loss": float(sums[d + 2]),
                         "fvu": float(sums[d]) / max(spread, 1e-12), "l0": float(sums[d + 1]) / total,
                         "dead": int((self.since_fired >= self.cfg.dead_after).sum())})

    def _reconstruction(self, xs: torch.Tensor, codes: torch.Tensor, recon: torch.Tensor) -> torch.Tensor:
        if self.cfg.kind != "matryoshka":
            return ((xs - recon) ** 2).sum(dim=1).mean() / xs.shape[1]
        losses = []
        for width in self.sae.widths:
            part = codes[:, :width] @ self.sae.W_dec[:width] + self.sae.b_dec
            losses.append(((xs - part) ** 2).sum(dim=1).mean() / xs.shape[1])
        return torch.stack(losses).mean()

    def _aux(self, xs: torch.Tensor, recon: torch.Tensor, x: torch.Tensor, weight: float) -> torch.Tensor:
        """Gao et al. 2024's AuxK: the dead latents' top ``aux_k`` codes reconstruct the error, normalised by the
        error's mean squared norm over every process's tokens (this process's share of the mean: ``weight``)."""
        dead = self.since_fired >= self.cfg.dead_after
        k = min(self.cfg.aux_k, self.cfg.latents // 2, int(dead.sum()))
        if self.cfg.kind == "relu" or k < 1:
            return xs.new_zeros(())
        error = (xs - recon).detach()
        if len(x):
            pre = self.sae.pre_activations(x).relu()
            pre = torch.where(dead, pre, torch.zeros_like(pre))
            values, index = torch.topk(pre, k, dim=1)
            guess = torch.zeros_like(pre).scatter(1, index, values) @ self.sae.W_dec
            missed, size = ((error - guess) ** 2).sum(dim=1).mean(), (error ** 2).sum(dim=1).mean()
        else:
            missed, size = xs.new_zeros(()), xs.new_zeros(())
        return missed * weight / self.replicas.sum((size * weight)[None])[0].clamp_min(1e-12)
