"""SAE replicas in lockstep: the round plan every process derives from the same table; replicas in threads joined
by stand-in collectives (each checks that every thread called the same collective on the same shape, which a real
process group would answer with a hang or garbage), and in two forked processes joined by a real gloo group, that
must end with equal weights whatever tokens each one read. Training from a model's passes under ``torchrun``, with a
kill and a resume, is in tests/e2e/test_sae_torchrun.py (``make distributed-check``)."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from helpers.processes import run_gloo
from vitscope.sae.distributed import Replicas, local_shares, plan_round
from vitscope.sae.settings import SAETraining
from vitscope.sae.trainer import Trainer
from vitscope.sae.training import _end_of_pass


def test_shares_of_a_minibatch_differ_by_at_most_one_and_add_up() -> None:
    assert local_shares(256, 2) == [128, 128]
    assert local_shares(31, 3) == [11, 10, 10]
    assert local_shares(5, 1) == [5]


def test_full_buffers_train_on_half_as_one_process_does() -> None:
    plan = plan_round([64, 64], [False, False], [8, 8], steps_left=100)
    assert (plan.steps, plan.taken, plan.batches, plan.final) == (4, (32, 32), (4, 4), False)
    assert [plan.tokens(i, [8, 8]) for i in range(4)] == [16] * 4


def test_a_process_whose_pass_ended_brings_what_it_has_and_then_nothing() -> None:
    plan = plan_round([64, 20], [False, True], [8, 8], steps_left=100)
    assert (plan.steps, plan.taken, plan.batches, plan.final) == (4, (32, 16), (4, 2), False)
    assert [plan.tokens(i, [8, 8]) for i in range(4)] == [16, 16, 8, 8]  # the later steps: one process's tokens


def test_the_last_round_takes_every_whole_minibatch_and_empties_the_buffers() -> None:
    plan = plan_round([20, 3], [True, True], [8, 8], steps_left=100)
    assert (plan.steps, plan.taken, plan.batches, plan.final) == (2, (20, 3), (2, 0), True)
    assert plan_round([3, 0], [True, True], [8, 8], steps_left=100).steps == 0
    assert plan_round([64, 64], [False, False], [8, 8], steps_left=1).batches == (1, 1)  # the schedule's end


def test_every_step_of_any_round_sees_tokens_and_no_process_gives_more_than_it_holds() -> None:
    rng = random.Random(0)
    for _ in range(500):
        world = rng.randint(1, 4)
        shares = local_shares(rng.randint(world, 40), world)
        ended = [rng.random() < 0.5 for _ in range(world)]
        full = rng.randint(2 * sum(shares), 200)  # a process still reading enters only with a full buffer
        filled = [rng.randint(0, full) if e else full for e in ended]
        plan = plan_round(filled, ended, shares, steps_left=rng.randint(0, 30))
        assert plan.final == all(ended)
        assert all(0 <= n * s <= t <= f for n, s, t, f in zip(plan.batches, shares, plan.taken, filled))
        assert all(plan.tokens(i, shares) > 0 for i in range(plan.steps))
        if not plan.final and plan.steps:
            assert max(plan.batches) == plan.steps


class _Hub:
    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world, timeout=60)
        self.slots: list = [None] * world


class _ThreadReplicas(Replicas):
    """One replica per thread; a collective waits for every thread and refuses a call the others did not make."""

    def __init__(self, rank: int, hub: _Hub) -> None:
        self.rank, self.world, self.hub = rank, len(hub.slots), hub

    def _all(self, what: str, values: torch.Tensor) -> list[torch.Tensor]:
        self.hub.slots[self.rank] = (what, tuple(values.shape), values.detach().clone())
        self.hub.barrier.wait()
        calls = list(self.hub.slots)
        self.hub.barrier.wait()  # every thread has read the slots before any writes its next call
        assert len({c[:2] for c in calls}) == 1, f"threads called different collectives: {[c[:2] for c in calls]}"
        return [c[2] for c in calls]

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        return torch.stack(self._all("sum", values)).sum(dim=0)

    def max(self, values: torch.Tensor) -> torch.Tensor:
        return torch.stack(self._all("max", values)).amax(dim=0)

    def gather(self, values: torch.Tensor) -> list[torch.Tensor]:
        return self._all("gather", values)


def _replicas_in_threads(config: SAETraining, streams: list[list[list[int]]], buffer: int) -> list[Trainer | None]:
    """Train one replica per thread: ``streams[rank][pass]``: the sizes of the chunks of tokens it reads in that
    pass (its own random tokens; a process with no token in the first pass joins at its end)."""
    hub, world = _Hub(len(streams)), len(streams)
    trainers: list[Trainer | None] = [None] * world
    errors: list[BaseException] = []

    def replica(rank: int) -> None:
        try:
            replicas = _ThreadReplicas(rank, hub)
            gen = torch.Generator().manual_seed(100 + rank)
            scale = torch.linspace(0.5, 3.0, 8)

            def make(width: int) -> Trainer:
                return Trainer(width, config, torch.device("cpu"), buffer, replicas)

            for chunks in streams[rank]:
                for size in chunks:
                    trainers[rank] = trainers[rank] or make(8)
                    trainers[rank].push(torch.randn(size, 8, generator=gen) * scale + 1.0)
                trainers[rank] = _end_of_pass(trainers[rank], replicas, make, lambda: ValueError("no token"))
        except BaseException as err:  # a thread's failure breaks the others' barrier: report the first cause
            errors.append(err)
            hub.barrier.abort()

    threads = [threading.Thread(target=replica, args=(rank,)) for rank in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a replica is stuck in a collective"
    first = next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), None)
    if first is not None or errors:
        raise first or errors[0]
    return trainers


@pytest.mark.parametrize("kind", ["topk", "batchtopk", "relu"])
def test_replicas_reading_uneven_streams_take_the_same_steps_to_the_same_weights(kind: str, one_thread) -> None:
    config = SAETraining(kind=kind, latents=32, k=4, tokens=900, batch_tokens=31, lr=1e-2, dead_after=60, aux_k=8,
                         l1=0.1)
    streams = [[[7] * 40, [5] * 30, [11] * 9], [[], [13] * 17, [3] * 50]]  # rank 1 reads nothing in the first pass
    one, two = _replicas_in_threads(config, streams, buffer=80)
    for name, value in one.sae.state_dict().items():
        assert torch.equal(two.sae.state_dict()[name], value), name
    assert (one.step, one.seen, one.log) == (two.step, two.seen, two.log)
    assert torch.equal(one.since_fired, two.since_fired)
    assert one.done  # every step of the schedule taken, though the first pass came from one replica alone
    assert one.log[-1]["fvu"] < one.log[0]["fvu"]
    assert not torch.equal(one.sae.b_dec, torch.zeros(8)) and float(one.sae.scale) != 1.0  # started from the data


def test_a_replica_that_reads_less_brings_nothing_to_the_last_steps_and_no_token_is_counted_twice(one_thread) -> None:
    config = SAETraining(kind="topk", latents=16, k=2, tokens=10_000, batch_tokens=20, lr=1e-3)
    one, two = _replicas_in_threads(config, [[[50] * 4], [[3] * 5]], buffer=40)  # 200 and 15 tokens, one pass
    # rank 0: rounds on full buffers (20 tokens each, two of its shares of 10) and then its whole shares; rank 1: its
    # one whole share of 15 tokens; every token trained is counted once over both
    assert one.seen == two.seen == 10 * one.step + 10 * 1
    assert torch.equal(one.sae.W_dec, two.sae.W_dec)


def _gloo_replica(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from vitscope.engine.distributed import Shard
    from vitscope.sae.distributed import GroupReplicas

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        replicas = GroupReplicas(Shard(rank, world))
        config = SAETraining(kind="batchtopk", latents=32, k=4, tokens=600, batch_tokens=32, lr=1e-2, dead_after=40)
        gen = torch.Generator().manual_seed(7 + rank)
        trainer = None

        def make(width: int) -> Trainer:
            return Trainer(width, config, torch.device("cpu"), 96, replicas)

        for chunks in ([[9] * 30, []], [[4] * 20, [17] * 11], [[5] * 31, [6] * 29]):
            for size in chunks[rank]:
                trainer = trainer or make(8)
                trainer.push(torch.randn(size, 8, generator=gen) * torch.linspace(0.5, 3.0, 8))
            trainer = _end_of_pass(trainer, replicas, make, lambda: ValueError("no token"))
        state = trainer.state()  # a collective too: every process's shuffling state
        torch.save({"sae": trainer.sae.state_dict(), "step": trainer.step, "seen": trainer.seen, "log": trainer.log,
                    "gens": state["gens"]}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_gloo_processes_reading_uneven_streams_end_with_the_same_weights(tmp_path) -> None:
    run_gloo(_gloo_replica, str(tmp_path))
    one, two = (torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(2))
    for name, value in one["sae"].items():
        assert torch.equal(two["sae"][name], value), name
    assert (one["step"], one["seen"], one["log"]) == (two["step"], two["seen"], two["log"])
    assert one["step"] == 19 and one["log"][-1]["fvu"] < one["log"][0]["fvu"]  # ceil(600 / 32): all taken
    assert not torch.equal(one["gens"][0], one["gens"][1])  # each process shuffles its own buffer


def test_alone_the_replica_protocol_costs_nothing() -> None:
    alone = Replicas()
    x = torch.arange(3.0)
    assert alone.sum(x) is x and alone.max(x) is x and alone.gather(x) == [x]


def test_under_torchrun_sae_eval_refuses_as_a_command_of_one_process(tmp_path) -> None:
    from helpers.cli import cli

    torchrun = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}
    proc = cli("sae", "eval", "--sae", str(tmp_path), "--model", "tiny-vit", "--data", str(tmp_path), env=torchrun)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "'vitscope sae eval' runs as one process; under torchrun only analyze, compare, probe, sae train share" \
        in proc.stderr


@pytest.mark.parametrize("kind", ["topk", "relu"])
def test_two_replicas_on_parts_take_the_steps_of_one_process_on_the_whole(kind: str) -> None:
    """The gradients are weighted by each process's share of a step's tokens: two replicas fed a quarter and three
    quarters of every minibatch end where one process fed the whole minibatches ends (per-token kinds; batch top-k
    picks per process)."""
    cfg = SAETraining(kind=kind, latents=32, k=4, tokens=10000, batch_tokens=40, lr=1e-2, dead_after=1, aux_k=8,
                      l1=0.1)
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(40, 8, generator=gen) * torch.linspace(0.5, 3, 8) + 1 for _ in range(6)]
    one = Trainer(8, cfg, torch.device("cpu"), 80)
    one._start(torch.cat(xs))
    for x in xs:
        one._step(x, len(x))
    hub, out = _Hub(2), [None, None]

    cut = (0, 10, 40)  # uneven shares: a sum of the processes' own means would point elsewhere than the whole's

    def replica(r: int) -> None:
        t = Trainer(8, cfg, torch.device("cpu"), 80, _ThreadReplicas(r, hub))
        t._start(torch.cat([x[cut[r] : cut[r + 1]] for x in xs]))
        for x in xs:
            t._step(x[cut[r] : cut[r + 1]], 40)
        out[r] = t

    threads = [threading.Thread(target=replica, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, value in one.sae.state_dict().items():
        torch.testing.assert_close(out[0].sae.state_dict()[name], value, rtol=1e-5, atol=1e-5, msg=name)
