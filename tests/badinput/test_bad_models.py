"""docs/errors.md, models: names, hub ids and model folders that cannot be loaded as asked."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.bad_input import finished, folder_with_one_good_image, one_error
from helpers.cli import cli
from helpers.hf_factories import make


@pytest.fixture(scope="module")
def saved_vit(tmp_path_factory):
    """A tiny ViTModel written with save_pretrained (safetensors)."""
    folder = tmp_path_factory.mktemp("models") / "vit"
    make("vit").save_pretrained(folder)
    return folder


@pytest.fixture
def photos(tmp_path):
    return folder_with_one_good_image(tmp_path)


def _analyze(model, photos, out, *extra):
    return cli("analyze", "-m", str(model), "-d", str(photos), "-o", str(out), "-a", "attention_stats", *extra)


def _copy(saved_vit, tmp_path):
    return shutil.copytree(saved_vit, tmp_path / "model")


def test_model_unknown_name(photos, tmp_path):
    one_error(_analyze("tiny-vt", photos, tmp_path / "out"), "unknown model 'tiny-vt'. Did you mean tiny-vit")


def test_model_hub_id_offline(photos, tmp_path):
    one_error(_analyze("hf:facebook/dinov2-small", photos, tmp_path / "out"),
              "not in the local Hugging Face cache and the hub cannot be reached (offline)")


def test_model_broken_config(saved_vit, photos, tmp_path):
    model = _copy(saved_vit, tmp_path)
    (model / "config.json").write_text("{not json")
    one_error(_analyze(model, photos, tmp_path / "out"), "has no readable config.json")


def test_model_folder_without_config(photos, tmp_path):
    (tmp_path / "empty").mkdir()
    one_error(_analyze(tmp_path / "empty", photos, tmp_path / "out"), "is a folder but not a model")
    one_error(_analyze(photos / "good.png", photos, tmp_path / "out"), "is a file; give the model's folder")


def test_model_weights_of_other_shapes(saved_vit, photos, tmp_path):
    model = _copy(saved_vit, tmp_path)
    weights = load_file(model / "model.safetensors")
    key = next(k for k in weights if k.endswith("query.weight") or k.endswith("q_proj.weight"))
    weights[key] = torch.zeros(5, 5)
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    line = one_error(_analyze(model, photos, tmp_path / "out"), "do not fit the architecture its config.json")
    assert "is [5, 5] in the file, the model expects [32, 32]" in line


def test_model_damaged_safetensors(saved_vit, photos, tmp_path):
    model = _copy(saved_vit, tmp_path)
    data = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(data[: len(data) // 2])
    one_error(_analyze(model, photos, tmp_path / "out"), "are damaged")


def test_model_pickle_weights(saved_vit, photos, tmp_path):
    model = _copy(saved_vit, tmp_path)
    torch.save(load_file(model / "model.safetensors"), model / "pytorch_model.bin")
    (model / "model.safetensors").unlink()
    one_error(_analyze(model, photos, tmp_path / "refused"), "holds its weights as pickle (pytorch_model.bin)")
    trusted = cli("--trust-pickle", "analyze", "-m", str(model), "-d", str(photos), "-o", str(tmp_path / "out"),
                  "-a", "attention_stats")
    assert finished(trusted, tmp_path / "out")["num_images"] == 1


def test_model_type_not_supported(saved_vit, photos, tmp_path):
    model = _copy(saved_vit, tmp_path)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": "llama", "architectures": ["LlamaModel"]}))
    one_error(_analyze(model, photos, tmp_path / "out"), "model type 'llama' is not supported; supported: aimv2, beit")


def test_model_type_unknown_to_transformers(saved_vit, photos, tmp_path):
    model = _copy(saved_vit, tmp_path)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": "frobnicator"}))
    one_error(_analyze(model, photos, tmp_path / "out"), "has model type `frobnicator`")


def test_model_damaged_vitscope_checkpoint(photos, tmp_path):
    import vitscope
    from vitscope.models.checkpoint import save_checkpoint

    folder = save_checkpoint(vitscope.load_model("tiny-vit"), tmp_path / "ckpt")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:100])
    one_error(_analyze(folder, photos, tmp_path / "out"), "model.safetensors is damaged")


def test_model_cnn_asked_for_attention(photos, tmp_path):
    one_error(_analyze("tiny-resnet", photos, tmp_path / "out"),
              "analysis 'attention_stats' cannot run on tiny-resnet: the model is a CNN and has no attention")


def test_sae_file_unreadable(photos, tmp_path):
    empty = tmp_path / "sae.pt"
    empty.write_bytes(b"")
    one_error(cli("sae", "eval", "--sae", str(empty), "-m", "tiny-vit-sup", "-d", str(photos)),
              f"{empty} is not a file of tensors vitscope reads safely (an empty file)")


def test_sae_file_unreadable_plain_pickle(photos, tmp_path):
    """torch printed two lines of warnings about the pickle's protocol, and advice to load it unsafely."""
    import pickle

    raw = tmp_path / "raw.pt"
    raw.write_bytes(pickle.dumps({"a": 1}, protocol=4))
    result = cli("sae", "eval", "--sae", str(raw), "-m", "tiny-vit-sup", "-d", str(photos))
    said = one_error(result, f"{raw} is not a file of tensors vitscope reads safely (the safe unpickler refuses it")
    assert len(result.stderr.strip().splitlines()) == 1 and "weights_only" not in said, result.stderr


def test_model_asks_to_run_its_own_code(saved_vit, photos, tmp_path, monkeypatch):
    """A model folder whose config.json names code of its own (auto_map): transformers asked on the terminal, and a
    "y" (``yes | vitscope ...``) ran it. It is refused without a question; the code never runs."""
    import io
    import sys

    model = _copy(saved_vit, tmp_path)
    ran = tmp_path / "it ran"
    (model / "configuration_lab.py").write_text(f"open({str(ran)!r}, 'w').write('ran')\n"
                                                "from transformers import ViTConfig as LabConfig\n")
    config = json.loads((model / "config.json").read_text())
    config.update(model_type="lab_vit", auto_map={"AutoConfig": "configuration_lab.LabConfig"})
    (model / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 10))  # the answer a pipe from `yes` gives
    one_error(_analyze(model, photos, tmp_path / "out"), "asks to run code of its own (auto_map in config.json), "
                                                         "which vitscope never does")
    assert not ran.exists()


def test_model_damaged_vitscope_checkpoint_describing_a_huge_model(photos, tmp_path):
    """vitscope.json's sizes were built before the weights were read: a description of a 77 GB model allocated it
    (then blamed the batch size). The weights' header is compared with the description first."""
    import vitscope
    from vitscope.models.checkpoint import save_checkpoint

    folder = save_checkpoint(vitscope.load_model("tiny-vit"), tmp_path / "ckpt")
    meta = json.loads((folder / "vitscope.json").read_text())
    meta["config"]["embed_dim"] = 4096
    (folder / "vitscope.json").write_text(json.dumps(meta))
    error = one_error(_analyze(folder, photos, tmp_path / "out"), "does not fit the architecture in vitscope.json")
    assert "in the file" in error and "[4096] in the model" in error


def test_model_damaged_vitscope_checkpoint_describing_a_deep_model(photos, tmp_path):
    """A description asking for 10,000 blocks made them (24 s, 830 MB) before its weights' header was compared."""
    import time

    import vitscope
    from vitscope.models.checkpoint import save_checkpoint

    folder = save_checkpoint(vitscope.load_model("tiny-vit"), tmp_path / "ckpt")
    meta = json.loads((folder / "vitscope.json").read_text())
    meta["config"]["depth"] = 10_000
    (folder / "vitscope.json").write_text(json.dumps(meta))
    started = time.monotonic()
    one_error(_analyze(folder, photos, tmp_path / "out"), "it holds 6 blocks, the description 10000")
    assert time.monotonic() - started < 10



def test_model_damaged_vitscope_checkpoint_naming_empty_blocks(photos, tmp_path):
    """A header naming 2,000 empty 'blocks' matched a description of 2,000 blocks, which were all made (5 s; 40 s
    at 20,000) before the shapes were compared. Every block's tensors are checked against one block first."""
    import vitscope
    from vitscope.models.checkpoint import save_checkpoint

    folder = save_checkpoint(vitscope.load_model("tiny-vit"), tmp_path / "ckpt")
    save_file({"cls_token": torch.zeros(1, 1, 64), **{f"blocks.{i}.x": torch.zeros(0) for i in range(2000)}},
              str(folder / "model.safetensors"))
    meta = json.loads((folder / "vitscope.json").read_text())
    meta["config"]["depth"] = 2000
    (folder / "vitscope.json").write_text(json.dumps(meta))
    one_error(_analyze(folder, photos, tmp_path / "out"),
              "does not fit the architecture in vitscope.json: blocks.0.x is [0] in the file, unknown in the model")
