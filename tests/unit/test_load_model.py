"""load_model: registered names, hf: directories and cache, offline errors, checkpoints, suggestions."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as tf

import vitscope
from helpers.hf_factories import SMALL, make
from vitscope.errors import VitscopeValueError
from vitscope.models.checkpoint import save_checkpoint
from vitscope.models.errors import ModelLoadError
from vitscope.models.load import UnknownModelError, describe_models
from vitscope.models.registry import registry

TEXT = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32}


def test_every_builtin_name_loads_with_matching_summary():
    for name, entry in registry().items():
        if entry.builder is None:
            continue
        b = vitscope.load_model(name)
        s = b.spec
        assert (s.num_blocks, s.num_heads, s.embed_dim, s.patch_size) == (entry.blocks, entry.heads, entry.width,
                                                                           entry.patch), name
        assert s.prefix_kinds == entry.prefix


def test_unknown_name_suggests_closest():
    with pytest.raises(UnknownModelError, match="Did you mean tiny-vit"):
        vitscope.load_model("tiny-vitt")


def test_hub_alias_offline_fails_in_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as err:
        vitscope.load_model("dino-vitb16")
    assert "\n" not in str(err.value) and "offline" in str(err.value)


def test_models_table_marks_offline_availability():
    rows = {r["name"]: r for r in describe_models()}
    assert rows["tiny-vit"]["offline"] is True
    assert rows["dino-vitb16"]["offline"] is False
    assert rows["deit-b16"]["prefix"] == "cls+dist"


@pytest.mark.parametrize("kind", ["vit-cls", "deit", "dinov2-reg", "clip", "siglip", "mae", "beit", "resnet", "dinov3",
                                  "ijepa-cls", "aimv2", "metaclip2", "metaclip2-cls", "siglip2",
                                  "siglip2-cls"])
def test_hf_local_directory_roundtrip(tmp_path, kind):
    model = make(kind)
    model.save_pretrained(tmp_path)
    b = vitscope.load_model(f"hf:{tmp_path}")
    twin = vitscope.load_model(str(tmp_path))  # a bare directory works too
    x = torch.randn(1, 3, *b.spec.image_size)
    with torch.no_grad():
        ref = vitscope.wrap(model)(x)
        out = b(x)
    key = "logits" if getattr(ref, "logits", None) is not None else "last_hidden_state"
    if getattr(ref, key, None) is None:
        key = "image_embeds"
    torch.testing.assert_close(getattr(out, key), getattr(ref, key))
    assert twin.spec == b.spec.__class__(**{**b.spec.__dict__, "name": str(tmp_path)})


@pytest.mark.parametrize(("whole", "tower"), [
    (lambda: tf.Aimv2Model(tf.Aimv2Config(vision_config=dict(SMALL), text_config=TEXT)), "vision_model"),
    (lambda: tf.MetaClip2Model(tf.MetaClip2Config(vision_config=dict(SMALL), text_config=TEXT)), "vision_model"),
    (lambda: tf.Siglip2Model(tf.Siglip2Config(vision_config={**{k: v for k, v in SMALL.items() if k != "image_size"},
                                                             "num_patches": 16}, text_config=TEXT)), "vision_model"),
])
def test_an_image_text_checkpoint_loads_its_trained_vision_tower(tmp_path, whole, tower):
    """A whole AIMv2 or MetaCLIP 2 checkpoint (image and text) gives its vision tower with the saved weights
    (loaded straight into the vision class, they would silently stay random)."""
    torch.manual_seed(0)
    model = whole().eval()
    model.save_pretrained(tmp_path)
    b = vitscope.load_model(str(tmp_path))
    saved = getattr(model, tower).state_dict()
    loaded = {k.removeprefix("vision_model."): v for k, v in b.model.state_dict().items()}
    shared = [k for k in saved if k in loaded]
    assert len(shared) >= len(saved) - 2, f"{len(shared)} of {len(saved)} tensors found"
    assert all(torch.equal(saved[k], loaded[k]) for k in shared)
    assert b.spec.num_blocks == SMALL["num_hidden_layers"] and b.spec.embed_dim == SMALL["hidden_size"]


@pytest.mark.parametrize("whole", [
    lambda: tf.CLIPModel(tf.CLIPConfig(vision_config=dict(SMALL), text_config=TEXT, projection_dim=24)),
    lambda: tf.MetaClip2Model(tf.MetaClip2Config(vision_config=dict(SMALL), text_config=TEXT, projection_dim=24)),
])
def test_an_image_text_checkpoint_keeps_its_own_projection_width(tmp_path, whole):
    """A whole CLIP or MetaCLIP 2 checkpoint whose image projection is not transformers' default 512 wide (CLIP-L/14:
    768) loads its vision tower with that projection: the image embeddings are the whole model's."""
    torch.manual_seed(0)
    model = whole().eval()
    model.save_pretrained(tmp_path)
    b = vitscope.load_model(str(tmp_path))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        embeds = b(x).image_embeds
        torch.testing.assert_close(embeds, model.get_image_features(pixel_values=x).pooler_output, atol=1e-6, rtol=0)
    assert embeds.shape == (2, 24)


def test_preprocessor_json_sets_the_spec(tmp_path):
    make("vit").save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({
        "image_mean": [0.1, 0.2, 0.3], "image_std": [0.4, 0.5, 0.6], "resample": 3,
        "size": {"shortest_edge": 40}, "crop_size": {"height": 32, "width": 32}, "do_center_crop": True}))
    s = vitscope.load_model(f"hf:{tmp_path}").spec
    assert s.mean == (0.1, 0.2, 0.3) and s.std == (0.4, 0.5, 0.6)
    assert s.interpolation == "bicubic" and s.resize_size == 40 and s.image_size == (32, 32)


def test_hub_id_loads_from_the_local_cache_offline(tmp_path, monkeypatch):
    """A hub id present in the HF cache loads with no network (the real hub code path)."""
    import huggingface_hub.constants as hc

    repo = tmp_path / "models--acme--tiny-vit"
    snap = repo / "snapshots" / "0123456789abcdef"
    make("vit").save_pretrained(snap)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123456789abcdef")
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from vitscope.models import hf_load

    assert hf_load.is_cached("acme/tiny-vit")
    try:
        b = vitscope.load_model("hf:acme/tiny-vit")
    except ModelLoadError as err:  # transformers read its cache location at import time
        pytest.skip(f"transformers ignores the patched cache location: {err}")
    assert b.spec.family == "vit" and b.spec.num_blocks == 2


def test_broken_directory_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError) as err:
        vitscope.load_model(str(tmp_path))
    assert "\n" not in str(err.value)


def test_vitscope_checkpoint_roundtrip(tmp_path):
    b = vitscope.load_model("tiny-vit-reg")
    save_checkpoint(b, tmp_path / "ckpt", recipe="none")
    assert not list((tmp_path / "ckpt").glob("*.pt")) and (tmp_path / "ckpt" / "model.safetensors").exists()
    again = vitscope.load_model(str(tmp_path / "ckpt"))
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(again(x), b(x))
    assert again.spec.prefix_kinds == ("cls", "reg", "reg")


def test_a_checkpoint_save_that_fails_midway_leaves_the_previous_one_whole(tmp_path, monkeypatch):
    import errno

    import vitscope.models.checkpoint as ckpt

    first = vitscope.load_model("tiny-vit-reg")
    save_checkpoint(first, tmp_path / "ckpt")
    real = ckpt.save_file

    def disk_full(tensors, filename, metadata=None):
        real(dict(list(tensors.items())[:2]), filename)  # a partial file lands under the temporary name
        raise OSError(errno.ENOSPC, "No space left on device", filename)

    monkeypatch.setattr(ckpt, "save_file", disk_full)
    second = vitscope.load_model("tiny-vit-sup")
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(second, tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["model.safetensors", "vitscope.json"]
    again = vitscope.load_model(str(tmp_path / "ckpt"))
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(again(x), first(x))


def test_import_does_not_pull_torchvision():
    import subprocess
    import sys

    code = ("import sys, vitscope; vitscope.load_model('tiny-vit'); "
            "print('torchvision' in sys.modules, 'timm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False False"


def test_spec_says_where_its_preprocessing_comes_from(tmp_path, monkeypatch):
    """Checkpoint processor, family default, registered alias, built-in: ``spec.preprocessing`` names the source."""
    from vitscope.models import ModelEntry, register_model
    from vitscope.models.families._common import DINO

    make("vit").save_pretrained(tmp_path)
    bare = vitscope.load_model(str(tmp_path)).spec
    assert bare.preprocessing.startswith("family default (no preprocessor_config.json")
    assert bare.image_size == (32, 32)  # config.json's size
    monkeypatch.setattr("vitscope.models.registry._REGISTRY", dict(registry()))  # the alias lives in this test only
    register_model(ModelEntry("test-alias", "vit", 2, 2, 32, 8, ("cls",), str(tmp_path),
                              {**DINO, "image_size": (48, 48), "resize_size": 56}))
    alias = vitscope.load_model("test-alias").spec
    assert alias.preprocessing.startswith("alias test-alias") and alias.image_size == (48, 48)
    assert alias.grid == (6, 6) and alias.resize_size == 56
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.5] * 3, "image_std": [0.5] * 3}))
    assert vitscope.load_model(str(tmp_path)).spec.preprocessing == "checkpoint processor (preprocessor_config.json)"
    assert vitscope.load_model("tiny-vit").spec.preprocessing.startswith("built-in")


def test_paper_aliases_crop_as_their_torchvision_code(tmp_path, monkeypatch):
    """DINO's Resize(256) + CenterCrop(224): a 640x427 photo is 383x256 px, cropped from column round(79.5) = 80;
    the checkpoint's own preprocessor_config.json keeps transformers' floor, 79."""
    from vitscope.models import ModelEntry, register_model
    from vitscope.models.families._common import DINO
    from vitscope.models.preprocess import resize_crop_geometry

    make("vit").save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "ViTImageProcessor", "size": {"shortest_edge": 256},
        "crop_size": {"height": 224, "width": 224}, "do_center_crop": True}))
    monkeypatch.setattr("vitscope.models.registry._REGISTRY", dict(registry()))  # the alias lives in this test only
    register_model(ModelEntry("test-dino", "vit", 2, 2, 32, 8, ("cls",), str(tmp_path), DINO))
    alias = vitscope.load_model("test-dino").spec
    assert alias.resize_rule == "torchvision"
    assert resize_crop_geometry((427, 640), alias) == ((256, 383), 80, 16)
    own = vitscope.load_model(str(tmp_path)).spec
    assert own.resize_rule == "transformers"
    assert resize_crop_geometry((427, 640), own) == ((256, 383), 79, 16)
    papers = ["dino-vits16", "dinov2-vits14", "dinov2-vits14-reg", "mae-vitb16", "deit-b16", "clip-vitb16",
              "convnext-tiny", "resnet50"]
    assert {n: registry()[n].preprocessing.get("resize_rule") for n in papers} == dict.fromkeys(papers, "torchvision")


def test_image_size_moves_crop_resize_and_grid_together(tmp_path, one_thread):
    """``load_model(..., image_size=)``: the crop becomes that size, the resize keeps its ratio to the crop, the grid
    follows (a CNN's measured), and a size the patches do not tile is refused in one line."""
    from PIL import Image

    from vitscope.models.input_size import with_image_size

    make("vit").save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({
        "size": {"shortest_edge": 40}, "crop_size": {"height": 32, "width": 32}, "do_center_crop": True}))
    b = vitscope.load_model(str(tmp_path), image_size=64)
    assert (b.spec.image_size, b.spec.resize_size, b.spec.grid) == ((64, 64), 80, (8, 8))  # 40/32 = 80/64
    assert b.spec.preprocessing == "checkpoint processor (preprocessor_config.json); input size 64 px set by the user"
    pixels = b.preprocess([Image.new("RGB", (90, 70))])
    assert tuple(pixels.shape) == (1, 3, 64, 64)
    with torch.no_grad(), b.record("blocks.0.attn.pattern") as rec:
        b(pixels)
    assert rec["blocks.0.attn.pattern"].shape[-1] == 65  # 8 x 8 patches and the CLS token
    assert vitscope.load_model("tiny-resnet", image_size=32).spec.grid == (2, 2)  # 64 px -> 4x4 natively
    tiny = vitscope.load_model("tiny-vit")
    assert with_image_size(tiny, (32, 48)).spec.grid == (4, 6) and tiny.spec.grid == (8, 8)
    with pytest.raises(VitscopeValueError, match=r"multiple of .* patch size 8 px; use 32 or 40$"):
        vitscope.load_model("tiny-vit", image_size=36)


def test_where_preprocessing_came_from_does_not_change_the_model_digest():
    """The label is not a setting: the feature cache and resume keep their keys whatever it says."""
    from dataclasses import replace

    from vitscope.models.digest import model_fingerprint

    a, b = vitscope.load_model("tiny-vit"), vitscope.load_model("tiny-vit")
    b.spec = replace(b.spec, preprocessing="given to vitscope.wrap")
    assert model_fingerprint(a) == model_fingerprint(b)
    b.spec = replace(b.spec, image_size=(32, 32), grid=(4, 4))
    assert model_fingerprint(a) != model_fingerprint(b)


def test_weights_changed_through_data_change_the_model_digest(monkeypatch):
    """Torch's version counters miss changes made through ``.data`` (EMA teachers): the remembered digest must not.
    Unchanged weights are hashed once."""
    from vitscope.models import digest

    model = vitscope.load_model("tiny-vit")
    first = digest.model_fingerprint(model)
    hashed = []
    plain = digest._hash_tensors
    monkeypatch.setattr(digest, "_hash_tensors", lambda h, t: (hashed.append(1), plain(h, t)))
    assert digest.model_fingerprint(model) == first and not hashed  # remembered
    fc1 = model.model.blocks[0].mlp.fc1.weight
    seen = {first}
    for change in (lambda w: w.mul_(0.5),  # every value
                   lambda w: w[3].add_(w[3].abs().max() * 1e-3),  # one row, a little
                   lambda w: w.copy_(w[:, torch.arange(w.shape[1]).roll(1)])):  # columns permuted
        change(fc1.data)
        now = digest.model_fingerprint(model)
        assert now not in seen
        seen.add(now)
    assert len(hashed) == 3
