"""Loading a save_pretrained directory is deterministic and quiet: no invented pooler, one warning for holes."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers as tf
from safetensors.torch import load_file, save_file

from vitscope.engine.provenance import model_identity
from vitscope.models.errors import ModelLoadError
from vitscope.models.hf_pretrained import RandomWeightsWarning
from vitscope.models.load import load_model

CONFIG = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
              patch_size=8)


@pytest.fixture()
def no_pooler(tmp_path):
    torch.manual_seed(0)
    folder = tmp_path / "vit-no-pooler"
    tf.ViTModel(tf.ViTConfig(**CONFIG), add_pooling_layer=False).save_pretrained(folder)
    return folder


def test_a_checkpoint_without_pooler_loads_the_same_weights_every_time_and_quietly(no_pooler, capfd) -> None:
    capfd.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RandomWeightsWarning)
        first = load_model(f"hf:{no_pooler}")
        second = load_model(f"hf:{no_pooler}")
    out, err = capfd.readouterr()
    assert "LOAD REPORT" not in out + err and "MISSING" not in out + err and "Loading weights" not in err
    assert first.model.pooler is None
    assert model_identity("m", first)["weights_sha256"] == model_identity("m", second)["weights_sha256"]
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        a, b = first.model(pixel_values=x), second.model(pixel_values=x)
    assert torch.equal(a.last_hidden_state, b.last_hidden_state)


def test_a_checkpoint_with_its_pooler_keeps_it(tmp_path) -> None:
    torch.manual_seed(0)
    folder = tmp_path / "vit-pooler"
    saved = tf.ViTModel(tf.ViTConfig(**CONFIG))
    saved.save_pretrained(folder)
    loaded = load_model(f"hf:{folder}")
    assert loaded.model.pooler is not None
    assert torch.equal(loaded.model.pooler.dense.weight, saved.pooler.dense.weight)


def test_other_missing_weights_are_one_warning_naming_them(no_pooler) -> None:
    weights = load_file(no_pooler / "model.safetensors")
    hole = next(k for k in weights if k.endswith("output.dense.bias"))
    del weights[hole]
    save_file(weights, no_pooler / "model.safetensors", metadata={"format": "pt"})
    with pytest.warns(RandomWeightsWarning, match=r"1 weight\(s\) of ViTModel are not in the checkpoint .*bias"):
        load_model(f"hf:{no_pooler}")


def test_a_broken_preprocessor_config_is_one_line_not_a_bug(no_pooler) -> None:
    from vitscope.errors import VitscopeValueError

    (no_pooler / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(VitscopeValueError, match="preprocessor_config.json is not valid JSON"):
        load_model(f"hf:{no_pooler}")


def test_pickle_weights_are_refused_unless_trusted(tmp_path, monkeypatch) -> None:
    torch.manual_seed(0)
    folder = tmp_path / "vit-pickle"
    saved = tf.ViTModel(tf.ViTConfig(**CONFIG), add_pooling_layer=False)
    saved.save_pretrained(folder)
    weights = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save(weights, folder / "pytorch_model.bin")  # what older checkpoints ship
    monkeypatch.delenv("VITSCOPE_TRUST_PICKLE", raising=False)
    with pytest.raises(ModelLoadError, match=r"pickle \(pytorch_model.bin\).*pass --trust-pickle"):
        load_model(f"hf:{folder}")
    monkeypatch.setenv("VITSCOPE_TRUST_PICKLE", "1")  # what `vitscope --trust-pickle ...` sets
    loaded = load_model(f"hf:{folder}")
    assert torch.equal(loaded.model.embeddings.patch_embeddings.projection.weight,
                       saved.embeddings.patch_embeddings.projection.weight)


def test_the_trust_flag_is_a_root_option_of_the_command_line(monkeypatch) -> None:
    from typer.testing import CliRunner

    from vitscope.cli.main import app

    monkeypatch.delenv("VITSCOPE_TRUST_PICKLE", raising=False)
    result = CliRunner().invoke(app, ["--trust-pickle", "models", "--json"])
    assert result.exit_code == 0
    import os

    assert os.environ.get("VITSCOPE_TRUST_PICKLE") == "1"
