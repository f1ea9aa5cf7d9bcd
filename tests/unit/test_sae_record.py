"""An SAE and its measurement say what they were made of: cfg.json records the model's identity (weights digest,
preprocessing), the data's spec and fingerprint, the images per pass and the versions beside the training settings
(and still loads), and ``vitscope sae eval -o`` writes them with its numbers as results.json."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import vitscope
from vitscope.cli.main import app
from vitscope.data.open import as_source
from vitscope.data.synthetic.write import synthesize
from vitscope.engine.provenance import model_identity
from vitscope.engine.settings import describe_device
from vitscope.sae import SparseAutoencoder, load, save
from vitscope.sae.training import SAETraining, train

HOOK = "blocks.2.resid_post"
TINY = ["--latents", "32", "--k", "4", "--tokens", "256", "--buffer-tokens", "128", "--batch-tokens", "64"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"{synthesize(tmp_path_factory.mktemp('record') / 'world', 'coco', n=6, size=64, seed=5)}::coco"


@pytest.fixture(scope="module")
def backbone():
    return vitscope.load_model("tiny-vit-sup")


@pytest.fixture(scope="module")
def trained(world: str, tmp_path_factory: pytest.TempPathFactory):
    """An SAE folder written by ``vitscope sae train``."""
    out = tmp_path_factory.mktemp("trained") / "sae"
    result = CliRunner().invoke(app, ["sae", "train", "--model", "tiny-vit-sup", "--hook", HOOK, "--data", world,
                                      "--out", str(out), "-b", "4", *TINY])
    assert result.exit_code == 0, result.output
    return out


def _made_of(folder) -> dict:
    return json.loads((folder / "cfg.json").read_text())["vitscope"]


def test_train_records_the_model_the_data_and_the_images_per_pass(world: str, backbone, tmp_path) -> None:
    sae = train(backbone, HOOK, world, SAETraining(kind="topk", latents=32, k=4, tokens=256, buffer_tokens=128,
                                                   batch_tokens=64), out=tmp_path / "sae", batch_size=5)
    made_of = _made_of(tmp_path / "sae")
    identity = model_identity("tiny-vit-sup", backbone)
    assert made_of["models"] == [identity] and identity["weights_sha256"]
    assert made_of["models"][0]["preprocessing"] == backbone.spec.preprocessing
    source = as_source(world)
    assert made_of["data"]["fingerprint"] == source.fingerprint()
    assert made_of["data"]["num_files"] == len(source) and made_of["data"]["decode"] == "full"
    assert made_of["training"]["data"] == world and made_of["training"]["batch_size"] == 5
    assert made_of["vitscope_version"] == vitscope.__version__
    assert made_of["run"] == {"device": describe_device(None), "processes": 1}
    back = load(tmp_path / "sae")  # the loader reads the folder as before
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(back(x), sae(x), rtol=1e-4, atol=1e-4)
    assert (back.hook, back.model, back.tokens_of) == (HOOK, "tiny-vit-sup", "spatial")


def test_the_command_records_the_models_id_and_the_environment(trained, world: str, backbone) -> None:
    made_of = _made_of(trained)
    assert made_of["models"][0]["id"] == "tiny-vit-sup"
    assert made_of["models"][0]["weights_sha256"] == model_identity("tiny-vit-sup", backbone)["weights_sha256"]
    assert made_of["environment"]["torch"] == torch.__version__ and "python" in made_of["environment"]
    assert made_of["data"]["fingerprint"] == as_source(world).fingerprint()
    assert made_of["training"]["data"] == world and made_of["training"]["batch_size"] == 4


def test_eval_writes_results_json_with_the_numbers_and_what_they_were_made_of(trained, world: str, backbone,
                                                                              tmp_path) -> None:
    out = tmp_path / "eval"
    result = CliRunner().invoke(app, ["sae", "eval", "--sae", str(trained), "--model", "tiny-vit-sup", "--data",
                                      world, "--images", "2", "-b", "3", "-o", str(out)])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    doc = json.loads((out / "results.json").read_text())
    assert (out / "report.html").is_file()
    assert doc["command"] == "sae eval" and doc["config"]["data"] == world and doc["config"]["batch_size"] == 3
    identity = model_identity("tiny-vit-sup", backbone)
    assert doc["models"] == printed["models"] == [identity]
    assert doc["data"]["fingerprint"] == printed["data"]["fingerprint"] == as_source(world).fingerprint()
    assert doc["environment"]["torch"] == torch.__version__ and doc["num_images"] == 6
    numbers = doc["analyses"]["sae_eval"]["summary"]
    assert numbers["fvu"] == printed["fvu"] and numbers["spliced"] == printed["spliced"]
    assert numbers["hook"] == HOOK and numbers["tokens"] == printed["tokens"] == 6 * 64
    sae = doc["sae"]
    assert sae == printed["sae"] and (sae["d_sae"], sae["hook"], sae["path"]) == (32, HOOK, str(trained))
    assert sae["trained_on"]["data"]["fingerprint"] == as_source(world).fingerprint()
    assert sae["trained_on"]["models"][0]["weights_sha256"] == identity["weights_sha256"]


def test_a_folder_without_the_record_still_loads_and_is_measured(world: str, tmp_path) -> None:
    """Folders written before the record (and other tools' files) load as before; their measurement says so."""
    save(SparseAutoencoder(128, 32, kind="topk", k=4), tmp_path / "old", hook=HOOK, model="tiny-vit-sup")
    assert "models" not in _made_of(tmp_path / "old") and load(tmp_path / "old").d_sae == 32
    result = CliRunner().invoke(app, ["sae", "eval", "--sae", str(tmp_path / "old"), "--model", "tiny-vit-sup",
                                      "--data", world, "--images", "2", "-o", str(tmp_path / "eval")])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert doc["sae"]["trained_on"] == {} and len(doc["sae"]["weights_sha256"]) == 16


def test_eval_refuses_an_out_it_cannot_write_before_any_pass(trained, world: str, tmp_path) -> None:
    (tmp_path / "file").write_text("")
    result = CliRunner().invoke(app, ["sae", "eval", "--sae", str(trained), "--model", "tiny-vit-sup", "--data",
                                      world, "-o", str(tmp_path / "file")])
    assert result.exit_code != 0 and "--out" in result.output and "tiny-vit-sup: input" not in result.output
