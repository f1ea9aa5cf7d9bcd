"""Training sparse autoencoders from the stream of a model's activations: every kind learns (its error falls, its
sparsity holds), the written file is the trained SAE, a seed gives the same weights, and bad input is one line."""

from __future__ import annotations

import pytest
import torch

import vitscope
from vitscope.data.synthetic.write import synthesize
from vitscope.sae import load
from vitscope.sae.training import SAETraining, train

SMALL = dict(latents=128, k=8, tokens=4096, buffer_tokens=1024, batch_tokens=256, lr=2e-3, dead_after=2048)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"{synthesize(tmp_path_factory.mktemp('sae') / 'world', 'coco', n=32, size=64, seed=11)}::coco"


@pytest.fixture(scope="module")
def backbone():
    return vitscope.load_model("tiny-vit-sup")


@pytest.mark.parametrize("kind", ["relu", "topk", "batchtopk", "matryoshka"])
def test_every_kind_learns_and_writes_what_it_learnt(kind: str, world: str, backbone, tmp_path) -> None:
    l1 = {"l1": 1.0} if kind == "relu" else {}  # a lighter penalty: a few steps show the error falling
    sae = train(backbone, "blocks.3.resid_post", world, SAETraining(kind=kind, **SMALL, **l1), out=tmp_path / "sae")
    first, last = sae.training_log[0], sae.training_log[-1]
    assert last["tokens"] == 4096 and last["fvu"] < 0.85 * first["fvu"]
    if kind != "relu":
        assert last["l0"] == pytest.approx(8.0)  # k per token (batch top-k: on average over the minibatch)
    assert sorted(p.name for p in (tmp_path / "sae").iterdir()) == ["cfg.json", "sae_weights.safetensors"]
    back = load(tmp_path / "sae")
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(0)) * 10
    torch.testing.assert_close(back(x), sae(x), rtol=1e-4, atol=1e-4)
    assert (back.hook, back.model) == ("blocks.3.resid_post", "tiny-vit-sup")


def test_a_seed_gives_the_same_weights_and_another_seed_others(world: str, backbone) -> None:
    config = SAETraining(kind="topk", **{**SMALL, "tokens": 2048})
    a, b = train(backbone, "blocks.1.resid_post", world, config), train(backbone, "blocks.1.resid_post", world, config)
    c = train(backbone, "blocks.1.resid_post", world, SAETraining(kind="topk", seed=1, **{**SMALL, "tokens": 2048}))
    assert torch.equal(a.W_dec, b.W_dec) and torch.equal(a.b_dec, b.b_dec)
    assert not torch.equal(a.W_dec, c.W_dec)
    torch.testing.assert_close(a.W_dec.norm(dim=1), torch.ones(128))  # decoder rows of unit norm


def test_the_cls_tokens_alone_and_bad_input_in_one_line(world: str, backbone) -> None:
    sae = train(backbone, "blocks.5.resid_post", world, SAETraining(kind="topk", tokens_of="cls",
                                                                     **{**SMALL, "tokens": 128, "buffer_tokens": 64,
                                                                        "batch_tokens": 16}))
    assert sae.training_log[-1]["tokens"] == 128  # 32 images, one CLS token each: 4 passes
    with pytest.raises(ValueError, match="has no hook 'blocks.9.resid_post'"):
        train(backbone, "blocks.9.resid_post", world, SAETraining(**SMALL))
    with pytest.raises(ValueError, match="kind must be"):
        train(backbone, "blocks.1.resid_post", world, SAETraining(kind="gated"))
    with pytest.raises(ValueError, match="buffer_tokens must hold two minibatches"):
        train(backbone, "blocks.1.resid_post", world, SAETraining(**{**SMALL, "buffer_tokens": 100}))


def test_tokens_the_model_does_not_have_are_refused_before_any_pass(world: str, backbone, tmp_path) -> None:
    """Registers on a ViT without them, the class token on a CNN: one line, no pass, no SAE written."""
    from typer.testing import CliRunner

    from vitscope.cli.main import app

    with pytest.raises(ValueError, match="tiny-vit-sup has no registers: tokens_of 'registers' selects no token"):
        train(backbone, "blocks.1.resid_post", world, SAETraining(tokens_of="registers", **SMALL))
    with pytest.raises(ValueError, match="tiny-resnet has no class token"):
        train(vitscope.load_model("tiny-resnet"), "stages.2", world, SAETraining(tokens_of="cls", **SMALL))
    bad = CliRunner().invoke(app, ["sae", "train", "--model", "tiny-vit-sup", "--hook", "blocks.1.resid_post",
                                   "--data", world, "--out", str(tmp_path / "sae"), "--tokens-of", "registers",
                                   "--tokens", "64", "--buffer-tokens", "64", "--batch-tokens", "16"])
    assert bad.exit_code == 2 and "has no registers" in bad.output
    assert not (tmp_path / "sae").exists()


def test_the_command_trains_and_writes_the_sae(world: str, tmp_path) -> None:
    from typer.testing import CliRunner

    from vitscope.cli.main import app

    result = CliRunner().invoke(app, ["sae", "train", "--model", "tiny-vit-sup", "--hook", "blocks.2.resid_post",
                                      "--data", world, "--out", str(tmp_path / "sae"), "--latents", "64", "--k", "4",
                                      "--tokens", "2048", "--buffer-tokens", "1024", "--batch-tokens", "256",
                                      "--lr", "1e-3"])
    assert result.exit_code == 0, result.output
    assert "topk SAE of blocks.2.resid_post: 64 latents" in result.output
    assert load(tmp_path / "sae").d_sae == 64
    bad = CliRunner().invoke(app, ["sae", "train", "--model", "tiny-vit-sup", "--hook", "blocks.2.mlp_pre_act",
                                   "--data", world, "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "has no hook 'blocks.2.mlp_pre_act'" in bad.output


def _dies_in_the_second_pass(real):
    """``training.run`` that raises KeyboardInterrupt (a kill) when the second pass starts."""
    calls = []

    def run(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    return run


def test_killed_after_a_pass_the_same_call_resumes_to_the_same_weights(world: str, backbone, tmp_path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The state at each pass's end is all weights and counters (never a token): a rerun continues from it and ends
    where an unbroken run ends, bit for bit."""
    import vitscope.sae.training as training

    config = SAETraining(kind="batchtopk", **SMALL)  # two passes of 2,048 tokens
    whole = train(backbone, "blocks.3.resid_post", world, config, out=tmp_path / "whole")
    real = training.run
    monkeypatch.setattr(training, "run", _dies_in_the_second_pass(real))
    with pytest.raises(KeyboardInterrupt):
        train(backbone, "blocks.3.resid_post", world, config, out=tmp_path / "again")
    assert (tmp_path / "again" / ".training" / "training_state.pt").is_file()
    monkeypatch.setattr(training, "run", real)
    lines = []
    resumed = train(backbone, "blocks.3.resid_post", world, config, out=tmp_path / "again", log=lines.append)
    assert lines[0] == "resumed after pass 1 (2048 tokens)"
    for name, value in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name
    assert not (tmp_path / "again" / ".training").exists()
    other = SAETraining(kind="batchtopk", **{**SMALL, "lr": 1e-3})  # another run: starts over
    monkeypatch.setattr(training, "run", _dies_in_the_second_pass(real))
    with pytest.raises(KeyboardInterrupt):
        train(backbone, "blocks.3.resid_post", world, config, out=tmp_path / "third")
    monkeypatch.setattr(training, "run", real)
    lines.clear()
    train(backbone, "blocks.3.resid_post", world, other, out=tmp_path / "third", log=lines.append)
    assert not lines[0].startswith("resumed")


def test_a_buffer_sized_from_free_memory_is_kept_on_resume_and_recorded(world: str, backbone, tmp_path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The default buffer is sized from the memory free when the run starts: a resume under another reading keeps
    the first run's buffer (its shuffles, so its weights), and the file records it."""
    import json

    import vitscope.sae.training as training

    config = SAETraining(kind="topk", **{**SMALL, "buffer_tokens": None})  # two passes of 2,048 tokens

    def free_for(tokens: int) -> None:  # an eighth of free memory holds ``tokens`` float32 tokens of 128 channels
        monkeypatch.setattr(training, "available_bytes", lambda device: 8 * 4 * 128 * tokens)

    free_for(768)
    whole = train(backbone, "blocks.3.resid_post", world, config, out=tmp_path / "whole")
    assert json.loads((tmp_path / "whole" / "cfg.json").read_text())["vitscope"]["training"]["buffers"] == [768]
    real = training.run
    monkeypatch.setattr(training, "run", _dies_in_the_second_pass(real))
    with pytest.raises(KeyboardInterrupt):
        train(backbone, "blocks.3.resid_post", world, config, out=tmp_path / "again")
    monkeypatch.setattr(training, "run", real)
    free_for(1536)  # more memory free now: a fresh run would take a larger buffer
    resumed = train(backbone, "blocks.3.resid_post", world, config, out=tmp_path / "again")
    for name, value in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name
    assert json.loads((tmp_path / "again" / "cfg.json").read_text())["vitscope"]["training"]["buffers"] == [768]
    fresh = train(backbone, "blocks.3.resid_post", world, config)
    assert not torch.equal(fresh.W_dec, whole.W_dec)  # the buffer shapes the weights: why it is kept


def test_the_page_on_saes_runs_as_written(tmp_path, monkeypatch, capsys) -> None:
    from helpers.doc_examples import DOC, python_blocks

    blocks = python_blocks(DOC.parent / "sae.md")
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    synthesize(tmp_path / "world", "coco", n=16, size=64, seed=1)
    exec(compile(blocks[0], "docs/sae.md", "exec"), {})
    log, fvu = capsys.readouterr().out.splitlines()
    assert "'tokens': 4096" in log and 0.0 < float(fvu) < 1.0
    assert sorted(p.name for p in (tmp_path / "sae").iterdir()) == ["cfg.json", "sae_weights.safetensors"]


def test_batch_top_ks_threshold_averages_from_the_first_batchs_smallest_kept_code() -> None:
    """The inference threshold is a moving average (0.99) of every step's smallest kept code that starts at the
    first step's value, as dictionary_learning's BatchTopK does: started from zero, a short run writes an SAE far
    denser than its k."""
    from vitscope.sae.trainer import Trainer

    gen = torch.Generator().manual_seed(0)
    cfg = SAETraining(kind="batchtopk", latents=32, k=2, tokens=512, buffer_tokens=256, batch_tokens=128, lr=1e-3)
    trainer = Trainer(8, cfg, torch.device("cpu"), 256)
    smallest: list[float] = []
    count = trainer._count_firing

    def spy(codes: torch.Tensor, total: int) -> None:
        smallest.append(float(codes.detach()[codes > 0].min()))
        count(codes, total)

    trainer._count_firing = spy
    while not trainer.done:
        trainer.push(torch.randn(256, 8, generator=gen))
    expected = smallest[0]
    for value in smallest[1:]:
        expected = 0.99 * expected + 0.01 * value
    assert len(smallest) == trainer.step == 4
    torch.testing.assert_close(trainer.sae.threshold, torch.full((32,), expected))


def test_a_pass_with_fewer_tokens_than_a_minibatch_is_refused_not_written_untrained(backbone, tmp_path) -> None:
    """Two 64 px images give 2 x 64 = 128 spatial tokens a pass; a minibatch of 256 takes no step in any pass."""
    two = f"{synthesize(tmp_path / 'two', 'coco', n=2, size=64, seed=3)}::coco"
    config = SAETraining(**{**SMALL, "tokens": 2000})
    with pytest.raises(ValueError, match=r"gives 128 token\(s\) of blocks.3.resid_post, fewer than one minibatch "
                                         r"\(batch_tokens 256\)"):
        train(backbone, "blocks.3.resid_post", two, config, out=tmp_path / "sae")
    assert not (tmp_path / "sae" / "sae_weights.safetensors").exists()


def test_tokens_holding_nan_stop_the_training_at_the_end_of_the_pass() -> None:
    from vitscope.sae.trainer import Trainer
    from vitscope.sae.training import _check_pass

    cfg = SAETraining(kind="topk", latents=32, k=2, tokens=512, buffer_tokens=256, batch_tokens=128)
    trainer = Trainer(8, cfg, torch.device("cpu"), 256)
    tokens = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))
    trainer.push(tokens)
    _check_pass(trainer, "blocks.1.resid_post", "world", 256, cfg)  # finite: goes on
    tokens[[3, 9], 1] = torch.tensor([float("nan"), float("inf")])
    trainer.push(tokens)
    with pytest.raises(ValueError, match=r"2 token\(s\) of blocks.1.resid_post from world hold NaN or infinite"):
        _check_pass(trainer, "blocks.1.resid_post", "world", 512, cfg)


def test_training_that_runs_out_of_passes_says_so(world: str, backbone) -> None:
    from vitscope.sae.training import ShortTrainingWarning

    config = SAETraining(**{**SMALL, "tokens": 10**6, "max_epochs": 1})
    with pytest.warns(ShortTrainingWarning, match="stopped after max_epochs=1 passes at step"):
        train(backbone, "blocks.1.resid_post", world, config)


def test_setting_the_input_scale_leaves_the_buffer_as_it_is_whatever_the_default_dtype() -> None:
    from vitscope.sae.trainer import Trainer

    cfg = SAETraining(kind="topk", latents=8, k=2, tokens=64, buffer_tokens=8, batch_tokens=4)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the buffer is float64: a cast to double would not copy it
    try:
        trainer = Trainer(3, cfg, torch.device("cpu"), 8)
        trainer.buffer.fill_(-2.0)
        trainer.filled = 8
        trainer._start(trainer.buffer[:8])
    finally:
        torch.set_default_dtype(previous)
    assert bool((trainer.buffer == -2.0).all()) and bool((trainer.sae.b_dec < 0).all())
