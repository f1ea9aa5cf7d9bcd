"""Sparse autoencoder modules and their files in SAELens's layout: hand-computed codes, the folding of the input
scale, and files written the way SAELens writes them read back exactly."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from vitscope.sae import SparseAutoencoder, load, save


def _tiny(kind: str, **kw) -> SparseAutoencoder:
    sae = SparseAutoencoder(2, 3, kind=kind, k=kw.pop("k", 1), **kw)
    with torch.no_grad():
        sae.W_enc.copy_(torch.tensor([[1.0, 0.0, -1.0], [0.0, 2.0, 1.0]]))
        sae.b_enc.copy_(torch.tensor([0.0, -1.0, 0.5]))
        sae.W_dec.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]]))
        sae.b_dec.copy_(torch.tensor([0.5, 0.0]))
    return sae


X = torch.tensor([[1.5, 1.0], [0.5, -1.0]])
# by hand: x - b_dec = [[1, 1], [0, -1]]; @ W_enc = [[1, 2, 0], [0, -2, -1]]; + b_enc = [[1, 1, 0.5], [0, -3, -0.5]]


def test_codes_by_hand_for_every_rule() -> None:
    assert _tiny("relu").encode(X).tolist() == [[1.0, 1.0, 0.5], [0.0, 0.0, 0.0]]
    top = _tiny("topk", k=1).encode(X)
    assert top[1].tolist() == [0.0, 0.0, 0.0] and sorted(top[0].tolist()) == [0.0, 0.0, 1.0]
    batch = _tiny("batchtopk", k=1)
    assert batch.encode_batch(X).count_nonzero() == 2  # k x 2 tokens over the batch: both kept in the first row
    with torch.no_grad():
        batch.threshold.fill_(0.75)
    assert batch.encode(X).tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]  # JumpReLU at inference
    sae = _tiny("relu")
    codes = torch.tensor([[1.0, 0.0, 1.0]])
    assert torch.allclose(sae.decode(codes), torch.tensor([[2.1, 0.8]]))


def test_the_input_scale_folds_into_the_weights_exactly() -> None:
    sae = _tiny("topk", k=2)
    with torch.no_grad():
        sae.scale.fill_(4.0)
    plain = SparseAutoencoder(2, 3, kind="topk", k=2)
    with torch.no_grad():
        for name, value in sae.folded().items():
            getattr(plain, name).copy_(value)
    torch.testing.assert_close(plain.encode(X), sae.encode(X))
    torch.testing.assert_close(plain(X), sae(X))


@pytest.mark.parametrize("kind", ["relu", "topk", "batchtopk", "matryoshka"])
def test_a_saved_sae_loads_back_the_same(kind: str, tmp_path) -> None:
    sae = SparseAutoencoder(6, 16, kind=kind, k=3, seed=2)
    with torch.no_grad():
        sae.b_enc.normal_(generator=torch.Generator().manual_seed(1))
        sae.threshold.fill_(0.1)
        sae.scale.fill_(0.5)
    save(sae, tmp_path / "sae", hook="blocks.3.resid_post", model="tiny-vit-sup")
    back = load(tmp_path / "sae")
    x = torch.randn(10, 6, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(back.encode(x), sae.encode(x))
    torch.testing.assert_close(back(x), sae(x))
    assert (back.hook, back.model, back.kind) == ("blocks.3.resid_post", "tiny-vit-sup", kind)
    cfg = json.loads((tmp_path / "sae" / "cfg.json").read_text())
    assert cfg["architecture"] == {"relu": "standard", "topk": "topk"}.get(kind, "jumprelu")
    assert cfg["vitscope"]["input_scale"] == 0.5 and cfg["normalize_activations"] == "none"


def _saelens_folder(path, architecture: str, cfg: dict, weights: dict) -> None:
    """A folder as SAELens's ``save_inference_model`` writes it (keys and shapes of sae_lens 6)."""
    path.mkdir()
    save_file(weights, str(path / "sae_weights.safetensors"))
    (path / "cfg.json").write_text(json.dumps({"architecture": architecture, "d_in": 4, "d_sae": 5,
                                               "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": True,
                                               "normalize_activations": "none",
                                               "metadata": {"hook_name": "blocks.8.hook_resid_post",
                                                            "model_name": "gpt2"}, **cfg}))


def test_files_in_saelens_layout_load_and_encode_as_saelens_does(tmp_path) -> None:
    gen = torch.Generator().manual_seed(0)
    w = {"W_enc": torch.randn(4, 5, generator=gen), "b_enc": torch.randn(5, generator=gen),
         "W_dec": torch.randn(5, 4, generator=gen), "b_dec": torch.randn(4, generator=gen)}
    x = torch.randn(7, 4, generator=gen)
    pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]  # SAELens's hidden_pre
    _saelens_folder(tmp_path / "standard", "standard", {}, w)
    _saelens_folder(tmp_path / "topk", "topk", {"k": 2}, w)
    threshold = torch.full((5,), 0.3)
    _saelens_folder(tmp_path / "jump", "jumprelu", {}, {**w, "threshold": threshold})
    torch.testing.assert_close(load(tmp_path / "standard").encode(x), pre.relu())
    top = load(tmp_path / "topk").encode(x)
    assert (top.count_nonzero(dim=1) <= 2).all()
    kept = torch.topk(pre, 2, dim=1).values.relu()
    torch.testing.assert_close(top.sort(dim=1, descending=True).values[:, :2], kept.sort(dim=1, descending=True).values)
    # SAELens before 6: a top-k SAE is "standard", its activation named apart, k in its keyword arguments
    _saelens_folder(tmp_path / "topk5", "standard", {"activation_fn_str": "topk", "activation_fn_kwargs": {"k": 2}}, w)
    old_top = load(tmp_path / "topk5")
    assert old_top.kind == "topk" and old_top.k == 2
    torch.testing.assert_close(old_top.encode(x), top)
    jump = load(tmp_path / "jump")
    torch.testing.assert_close(jump.encode(x), pre.relu() * (pre > threshold))
    torch.testing.assert_close(jump(x), jump.encode(x) @ w["W_dec"] + w["b_dec"])
    assert jump.hook == "blocks.8.hook_resid_post" and jump.model == "gpt2"


def test_what_cannot_be_read_is_one_line(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="SAELens's layout"):
        load(tmp_path)
    w = {"W_enc": torch.zeros(4, 5), "b_enc": torch.zeros(5), "W_dec": torch.zeros(5, 4), "b_dec": torch.zeros(4)}
    _saelens_folder(tmp_path / "gated", "gated", {}, w)
    with pytest.raises(ValueError, match="gated"):
        load(tmp_path / "gated")
    _saelens_folder(tmp_path / "bad", "standard", {}, {**w, "b_dec": torch.zeros(3)})
    with pytest.raises(ValueError, match="b_dec has shape"):
        load(tmp_path / "bad")
    _saelens_folder(tmp_path / "tanh", "standard", {"activation_fn_str": "tanh-relu"}, w)
    with pytest.raises(ValueError, match="activation 'tanh-relu'"):
        load(tmp_path / "tanh")
    with pytest.raises(ValueError, match="kind must be"):
        SparseAutoencoder(4, 5, kind="gated")


def _weights(d_in: int = 4, d_sae: int = 6, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"W_enc": torch.randn(d_in, d_sae, generator=gen), "b_enc": torch.randn(d_sae, generator=gen),
            "W_dec": torch.randn(d_sae, d_in, generator=gen), "b_dec": torch.randn(d_in, generator=gen)}


def test_a_vit_prisma_folder_loads_as_prisma_encodes(tmp_path) -> None:
    """ViT-Prisma's files (vit_prisma/sae/sae.py: save_model, load_from_pretrained; config.json beside): the decoder
    bias subtracted before encoding, top-k then ReLU, per-token layer norm in and out (its default)."""
    w = _weights()
    folder = tmp_path / "prisma"
    folder.mkdir()
    torch.save(w, folder / "n_images_2600058.pt")  # the vanilla repos: a bare state dict
    (folder / "config.json").write_text(json.dumps({
        "d_in": 4, "expansion_factor": 1.5, "activation_fn_str": "topk", "activation_fn_kwargs": {"k": 2},
        "hook_point_layer": 9, "layer_subtype": "hook_resid_post", "model_name": "open-clip:laion/CLIP-ViT-B-32"}))
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    mu, std = x.mean(-1, keepdim=True), x.std(-1, keepdim=True)
    xn = (x - mu) / (std + 1e-5)
    pre = (xn - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    values, index = torch.topk(pre, 2, dim=-1)
    codes = torch.zeros_like(pre).scatter(-1, index, values.relu())
    sae = load(folder)
    torch.testing.assert_close(sae.encode(x), codes)
    torch.testing.assert_close(sae(x), (codes @ w["W_dec"] + w["b_dec"]) * (std + 1e-5) + mu)
    assert (sae.hook, sae.model) == ("blocks.9.hook_resid_post", "open-clip:laion/CLIP-ViT-B-32")
    assert sae.tokens_of == "all"  # neither cls_token_only nor use_patches_only: its runner read every token
    for flag, tokens_of in (("cls_token_only", "cls"), ("use_patches_only", "spatial")):
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "cls_token_only": False, "use_patches_only": False,
                                                        flag: True}))
        assert load(folder).tokens_of == tokens_of


def test_each_checkpoint_of_a_vit_prisma_folder_loads_by_name(tmp_path) -> None:
    """A folder reads its last ``n_images_<N>.pt``; naming an earlier one reads that one, not the last."""
    folder = tmp_path / "prisma"
    folder.mkdir()
    early, late = _weights(seed=1), _weights(seed=2)
    torch.save(early, folder / "n_images_100.pt")
    torch.save(late, folder / "n_images_2000.pt")
    (folder / "config.json").write_text(json.dumps({"d_in": 4, "normalize_activations": "none"}))
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(3))
    for path, w in ((folder, late), (folder / "n_images_2000.pt", late), (folder / "n_images_100.pt", early)):
        torch.testing.assert_close(load(path).encode(x), ((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]).relu())


def test_prismas_save_model_dict_reads_without_running_its_classes(tmp_path, monkeypatch) -> None:
    """``save_model`` pickles its config as a vit_prisma dataclass: read as a plain record by the weights-only
    unpickler, never importing or running vit_prisma."""
    import dataclasses
    import sys
    import types

    module = types.ModuleType("vit_prisma.sae.config")

    @dataclasses.dataclass
    class VisionModelSAERunnerConfig:
        d_in: int = 4
        activation_fn_str: str = "relu"
        normalize_activations: str = "none"
        hook_point_layer: int = 3
        layer_subtype: str = "hook_resid_post"
        model_name: str = "tiny"

    VisionModelSAERunnerConfig.__module__ = module.__name__
    VisionModelSAERunnerConfig.__qualname__ = "VisionModelSAERunnerConfig"
    module.VisionModelSAERunnerConfig = VisionModelSAERunnerConfig
    for name in ("vit_prisma", "vit_prisma.sae", "vit_prisma.sae.config"):
        monkeypatch.setitem(sys.modules, name, module if name.endswith("config") else types.ModuleType(name))
    folder = tmp_path / "topk"
    folder.mkdir()
    w = _weights()
    torch.save({"cfg": VisionModelSAERunnerConfig(), "state_dict": w}, folder / "weights.pt")
    monkeypatch.delitem(sys.modules, "vit_prisma.sae.config")  # the reader has no vit_prisma
    (folder / "config.json").write_text(json.dumps({"model_name": "tiny"}))
    sae = load(folder)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(sae.encode(x), ((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]).relu())
    assert sae.hook == "blocks.3.hook_resid_post"


def test_an_overcomplete_state_dict_loads_as_overcomplete_encodes(tmp_path) -> None:
    """overcomplete's keys (overcomplete/sae: MLPEncoder's final_block.0, DictionaryLayer's _weights normalised to
    unit rows times exp(multiplier) when read; no decoder bias, no centring; JumpSAE's log-thresholds)."""
    gen = torch.Generator().manual_seed(3)
    enc, bias, raw = torch.randn(6, 4, generator=gen), torch.randn(6, generator=gen), torch.randn(6, 4, generator=gen)
    state = {"encoder.final_block.0.weight": enc, "encoder.final_block.0.bias": bias, "dictionary._weights": raw,
             "dictionary.multiplier": torch.tensor(0.5)}
    torch.save(state, tmp_path / "topk.pt")
    torch.save({**state, "thresholds": torch.full((6,), -1.0)}, tmp_path / "jump.pt")
    x = torch.randn(5, 4, generator=gen)
    r = (x @ enc.T + bias).relu()
    dictionary = raw / (raw.norm(dim=1, keepdim=True) + 1e-8) * torch.exp(torch.tensor(0.5))
    top = load(tmp_path / "topk.pt", k=2)
    values, index = torch.topk(r, 2, dim=-1)
    torch.testing.assert_close(top.encode(x), torch.zeros_like(r).scatter(-1, index, values))
    torch.testing.assert_close(top(x), top.encode(x) @ dictionary)
    jump = load(tmp_path / "jump.pt")
    torch.testing.assert_close(jump.encode(x), r * (r > torch.exp(torch.tensor(-1.0))))
    torch.save({**state, "encoder.final_block.1.weight": torch.ones(6)}, tmp_path / "deep.pt")
    with pytest.raises(ValueError, match="non-linear encoder"):
        load(tmp_path / "deep.pt")
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")  # a whole pickled module: never unpickled
    with pytest.raises(ValueError, match="reads safely"):
        load(tmp_path / "module.pt")


def test_a_tied_overcomplete_encoder_keeps_its_bias(tmp_path) -> None:
    """``SAE.tied(bias=True)``: no encoder weight (the dictionary's transpose encodes) but an ``encoder.bias``."""
    gen = torch.Generator().manual_seed(4)
    raw, bias = torch.randn(6, 4, generator=gen), torch.randn(6, generator=gen)
    torch.save({"dictionary._weights": raw, "dictionary.multiplier": torch.tensor(0.0), "encoder.bias": bias,
                "encoder.tied_to._weights": raw, "encoder.tied_to.multiplier": torch.tensor(0.0)}, tmp_path / "tied.pt")
    dictionary = raw / (raw.norm(dim=1, keepdim=True) + 1e-8)
    x = torch.randn(5, 4, generator=gen)
    codes = (x @ dictionary.T + bias).relu()
    sae = load(tmp_path / "tied.pt")
    torch.testing.assert_close(sae.encode(x), codes)
    torch.testing.assert_close(sae(x), codes @ dictionary)


def test_a_token_normalised_sae_keeps_its_norm_through_a_save(tmp_path) -> None:
    sae = SparseAutoencoder(6, 8, kind="topk", k=3, seed=4, token_norm="layer_norm")
    save(sae, tmp_path / "sae")
    back = load(tmp_path / "sae")
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(5)) * 3 + 1
    assert back.token_norm == "layer_norm"
    torch.testing.assert_close(back(x), sae(x))
