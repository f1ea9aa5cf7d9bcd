"""Bad input to ``vitscope sae train|eval|benchmark`` is one ``error:`` line with the right exit status (2: bad usage,
1: a file or a run that cannot be used), never a traceback, and nothing unusable is written."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from helpers.cli import cli
from vitscope.data.synthetic.write import synthesize
from vitscope.sae import SparseAutoencoder, save

HOOK = "blocks.3.resid_post"
TINY = ("--latents", "32", "--k", "4", "-b", "8", "--batch-tokens", "64", "--buffer-tokens", "128")


def _one_line(run: subprocess.CompletedProcess, status: int, says: str) -> None:
    """``run`` ended with ``status`` and one ``error:`` line saying ``says``, no traceback."""
    lines = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert run.returncode == status, run.stdout + run.stderr
    assert len(lines) == 1 and says in lines[0], run.stderr
    assert "Traceback" not in run.stderr and "bug" not in run.stderr


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"{synthesize(tmp_path_factory.mktemp('bad') / 'world', 'coco', n=8, size=64, seed=5)}::coco"


def _saved(folder: Path, poison: bool = False) -> Path:
    """A small SAE of ``HOOK`` written to ``folder`` (``poison``: its encoder all NaN, as a diverged training's)."""
    sae = SparseAutoencoder(128, 32, kind="topk", k=4, seed=0)
    if poison:
        with torch.no_grad():
            sae.W_enc.fill_(float("nan"))
    return save(sae, folder, hook=HOOK, model="tiny-vit-sup")


def _eval(sae: Path, *more: str) -> subprocess.CompletedProcess:
    return cli("sae", "eval", "--sae", str(sae), "-m", "tiny-vit-sup", "--data", "nowhere", "--images", "2", *more)


def test_tokens_or_a_learning_rate_that_is_no_finite_number_is_bad_usage(tmp_path) -> None:
    train = ("sae", "train", "-m", "tiny-vit-sup", "--hook", HOOK, "--data", "nowhere", "--out", str(tmp_path / "s"))
    _one_line(cli(*train, *TINY, "--tokens", "inf"), 2, "--tokens must be a finite number")
    _one_line(cli(*train, *TINY, "--lr", "inf"), 2, "--lr must be a finite number")
    bench = ("sae", "benchmark", "-M", "tiny-vit-sup", "--out", str(tmp_path / "b"))
    _one_line(cli(*bench, "--tokens", "inf"), 2, "--tokens must be a finite number")
    _one_line(cli(*bench, "--lr", "inf"), 2, "--lr must be a finite number")
    assert not (tmp_path / "s").exists() and not (tmp_path / "b").exists()


def test_a_training_that_diverges_stops_in_one_line_and_writes_no_sae(world: str, tmp_path) -> None:
    run = cli("sae", "train", "-m", "tiny-vit-sup", "--hook", HOOK, "--data", world, "--out", str(tmp_path / "s"),
              *TINY, "--tokens", "256", "--lr", "1e30")
    _one_line(run, 1, "the SAE's training diverged")
    assert not (tmp_path / "s" / "sae_weights.safetensors").exists()


def test_an_sae_with_nan_weights_is_refused(tmp_path) -> None:
    _one_line(_eval(_saved(tmp_path / "nan", poison=True)), 1, "W_enc holds NaN or infinite values")


@pytest.mark.parametrize(("text", "says"), [('{"architecture": "topk",\n', "cfg.json is not readable JSON"),
                                            ("[1, 2]", "cfg.json is not a JSON object")])
def test_a_cfg_json_that_is_no_json_object_is_one_line(text: str, says: str, tmp_path) -> None:
    folder = _saved(tmp_path / "sae")
    (folder / "cfg.json").write_text(text)
    _one_line(_eval(folder), 1, says)


@pytest.mark.parametrize("name", ["cfg.json", "sae_weights.safetensors"])
def test_a_file_of_an_sae_folder_asks_for_the_folder(name: str, tmp_path) -> None:
    folder = _saved(tmp_path / "sae")
    _one_line(_eval(folder / name), 1, f"is one file of the SAE folder {folder}: give the folder")


def test_a_hook_the_model_lacks_is_bad_usage(world: str, tmp_path) -> None:
    train = ("sae", "train", "-m", "tiny-vit-sup", "--data", world, "--out", str(tmp_path / "s"), *TINY)
    _one_line(cli(*train, "--hook", "blocks.99.resid_post"), 2, "has no hook 'blocks.99.resid_post'")
    _one_line(cli(*train, "--hook", "resid_post"), 2, "has no hook 'resid_post'")
    _one_line(_eval(_saved(tmp_path / "sae"), "--hook", "blocks.99.resid_post"), 2,
              "has no hook 'blocks.99.resid_post'")
    bench = cli("sae", "benchmark", "-M", "tiny-vit-sup", "--hook", "blocks.9.resid_post", "--images", "2",
                "--heldout", "2", "--out", str(tmp_path / "b"))
    _one_line(bench, 2, "tiny-vit-sup has no hook 'blocks.9.resid_post'")
