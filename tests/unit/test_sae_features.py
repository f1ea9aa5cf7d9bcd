"""The ``sae_features`` analysis: its numbers equal a hand computation on an SAE whose codes are known, the regions
under the tokens come from the masks, and it refuses what it cannot read in one line; then the command end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers.cli import cli
from vitscope.analyses.activations.sae_features import REGION_GRID, SAEFeatures
from vitscope.analyses.base import Batch
from vitscope.autoencoders.files import save
from vitscope.autoencoders.model import SparseAutoencoder
from vitscope.functional.concept_tokens import token_coverage, token_region_labels
from vitscope.models.spec import ModelSpec

SPEC = ModelSpec(name="fake-vit", family="tiny-vit", kind="transformer", num_blocks=2, num_heads=2, embed_dim=4,
                 mlp_dim=8, patch_size=4, grid=(2, 3), num_prefix_tokens=1, prefix_kinds=("cls",),
                 image_size=(8, 12))
HOOK = "blocks.1.resid_post"


def _identity_sae(folder, kind: str = "relu", tokens_of: str | None = None) -> str:
    """Codes = relu(x) channel by channel (W_enc = W_dec = I, no biases): latent c fires where channel c > 0."""
    sae = SparseAutoencoder(4, 4, kind=kind, k=4)
    with torch.no_grad():
        sae.W_enc.copy_(torch.eye(4))
        sae.W_dec.copy_(torch.eye(4))
    extra = {"training": {"tokens_of": tokens_of}} if tokens_of else None
    save(sae, folder, hook=HOOK, model=SPEC.name, extra=extra)
    return str(folder)


def _batch(x: torch.Tensor, start: int, labels: list[int | None], regions: list | None = None) -> tuple[dict, Batch]:
    targets: dict = {"label": labels}
    if regions is not None:
        targets[REGION_GRID] = [None if r is None else ((2, 3), np.asarray(r)) for r in regions]
    b = x.shape[0]
    batch = Batch(pixels=torch.zeros(b, 3, 8, 12), indices=list(range(start, start + b)),
                  paths=[f"img{i}.png" for i in range(start, start + b)], spec=SPEC, grid=(2, 3), targets=targets)
    return {HOOK: x}, batch


@pytest.fixture
def data() -> list[tuple[dict, Batch]]:
    gen = torch.Generator().manual_seed(0)
    x1, x2 = torch.randn(3, 7, 4, generator=gen), torch.randn(2, 7, 4, generator=gen)
    regions = [[0, 0, 1, -1, -1, 1], [2, 2, 2, 2, -1, -1], None]
    return [_batch(x1, 0, [0, 1, None], regions), _batch(x2, 3, [1, 1], [[0] * 6, [-1] * 6])]


def test_the_numbers_are_their_hand_computation(tmp_path, data) -> None:
    acc = SAEFeatures(path=_identity_sae(tmp_path / "sae"), k=2, cards=2)
    for record, batch in data:
        acc.update(record, batch)
    result = acc.compute()
    x = torch.cat([r[HOOK] for r, _ in data])  # [5, 7, 4]
    codes = x[:, 1:].relu().double()  # the spatial tokens' codes [5, 6, 4]
    torch.testing.assert_close(result.tensors["frequency"], (codes > 0).double().mean(dim=(0, 1)))
    torch.testing.assert_close(result.tensors["mean_activation"], codes.mean(dim=(0, 1)))
    # classes: image 2 has no label; class 0 is image 0, class 1 images 1, 3, 4
    assert result.meta["class_labels"] == [0, 1]
    torch.testing.assert_close(result.tensors["class_mean"][0], codes[0].mean(dim=0))
    torch.testing.assert_close(result.tensors["class_mean"][1], codes[[1, 3, 4]].mean(dim=(0, 1)))
    torch.testing.assert_close(result.tensors["class_tokens"], torch.tensor([6.0, 18.0], dtype=torch.float64))
    # regions: image 2 has no masks and counts nowhere; -1 is the background
    labels = torch.tensor([[0, 0, 1, -1, -1, 1], [2, 2, 2, 2, -1, -1], [-9] * 6, [0] * 6, [-1] * 6])
    assert result.meta["region_labels"] == [-1, 0, 1, 2]
    for row, region in enumerate([-1, 0, 1, 2]):
        torch.testing.assert_close(result.tensors["region_mean"][row], codes[labels == region].mean(dim=0))
    # top images: an image's score is the latent's largest code over its patches; maps are the codes on the grid
    best = codes.amax(dim=1)  # [5, 4]
    scores, order = best.T.sort(dim=1, descending=True, stable=True)
    torch.testing.assert_close(result.tensors[f"{HOOK}.scores"], scores[:, :2])
    assert result.tensors[f"{HOOK}.indices"].tolist() == order[:, :2].tolist()
    first = order[0, 0].item()
    torch.testing.assert_close(result.tensors[f"{HOOK}.maps"][0, 0], codes[first, :, 0].float().reshape(2, 3))


def test_cards_are_the_most_frequent_latents_that_are_not_dense(tmp_path) -> None:
    a = torch.full((2, 7, 4), -1.0)
    a[0, 1:, 0] = 1.0  # latent 0: half the tokens, dense
    a[0, 1, 1] = 2.0  # latent 1: 1 token in 12
    a[1, 2, 2] = 3.0  # latent 2: 1 token in 12 of this batch, none of the next: 1 in 24; latent 3 never fires
    b = a.clone()
    b[1, 2, 2] = -1.0
    for cards, want in ((5, [1, 2]), (1, [1]), ((3, 2), [3, 2])):
        acc = SAEFeatures(path=_identity_sae(tmp_path / f"sae{cards}"), k=2, cards=cards)
        acc.update(*_batch(a, 0, [0, 1]))
        acc.update(*_batch(b, 2, [0, 1]))
        result = acc.compute()
        assert result.meta["cards"] == want
    torch.testing.assert_close(result.tensors["frequency"], torch.tensor([0.5, 1 / 12, 1 / 24, 0.0],
                                                                         dtype=torch.float64))
    assert [f.stem for f in result.figures()] == ["sae_features_frequency", "sae_features_cards"]


def test_the_sae_reads_the_tokens_it_was_trained_on(tmp_path, data) -> None:
    acc = SAEFeatures(path=_identity_sae(tmp_path / "sae", tokens_of="cls"), k=2)
    for record, batch in data:
        acc.update(record, batch)
    result = acc.compute()
    cls = torch.cat([r[HOOK] for r, _ in data])[:, 0].relu().double()  # [5, 4]
    torch.testing.assert_close(result.tensors["frequency"], (cls > 0).double().mean(dim=0))
    assert result.meta["sae"]["tokens_of"] == "cls" and "region_mean" not in result.tensors
    torch.testing.assert_close(result.tensors[f"{HOOK}.scores"][:, 0], cls.max(dim=0).values)


def test_token_regions_are_the_majority_of_each_tokens_pixels() -> None:
    masks = torch.zeros(2, 4, 6, dtype=torch.bool)  # a 2 x 3 grid of 2 x 2 patches
    masks[0, :2, :2] = True  # all of token 0
    masks[0, :2, 2] = True  # half of token 1: not a majority
    masks[1, 2:, 4:] = True  # all of token 5
    masks[1, 2, 2:4] = True
    masks[1, 3, 2] = True  # three quarters of token 4
    coverage = token_coverage(masks, (2, 3))
    torch.testing.assert_close(coverage[0], torch.tensor([1.0, 0.5, 0, 0, 0, 0], dtype=torch.float64))
    assert token_region_labels(coverage, torch.tensor([7, 9])).tolist() == [7, -1, -1, -1, 9, 9]
    assert token_region_labels(token_coverage(masks[:0], (2, 3)), torch.tensor([])).tolist() == [-1] * 6


def test_what_it_cannot_read_is_one_line(tmp_path) -> None:
    assert "needs an SAE" in SAEFeatures().why_unsupported(SPEC)
    save(SparseAutoencoder(4, 4, k=2), tmp_path / "other", hook=HOOK, model="another-model")
    assert "trained on another-model" in SAEFeatures(path=tmp_path / "other").why_unsupported(SPEC)
    save(SparseAutoencoder(6, 4, k=2), tmp_path / "wide", hook=HOOK)
    assert "reads 6 channels" in SAEFeatures(path=tmp_path / "wide").why_unsupported(SPEC)
    assert "cannot read its SAE" in SAEFeatures(path=tmp_path / "missing").why_unsupported(SPEC)
    save(SparseAutoencoder(4, 4, k=2), tmp_path / "nowhere", hook="blocks.9.resid_post")
    assert not SAEFeatures(path=tmp_path / "nowhere").supports(SPEC)
    assert "has no registers tokens" in SAEFeatures(path=tmp_path / "nowhere", tokens_of="registers").why_unsupported(
        SPEC)
    with pytest.raises(ValueError, match="tokens_of"):
        SAEFeatures(path=tmp_path / "other", tokens_of="corners")


def test_analyze_draws_the_cards_in_the_report(tmp_path) -> None:
    import vitscope
    from vitscope.data.synthetic.write import synthesize

    spec = vitscope.load_model("tiny-vit-sup").spec
    root = synthesize(tmp_path / "world", "coco", n=12, size=64, seed=3)
    save(SparseAutoencoder(spec.embed_dim, 32, kind="topk", k=4, seed=2), tmp_path / "sae",
         hook="blocks.2.resid_post", model=spec.name)
    out = tmp_path / "out"
    done = cli("analyze", "--model", "tiny-vit-sup", "--data", f"{root}::coco", "--analyses", "sae_features",
               "--param", f"sae_features.path={tmp_path / 'sae'}", "--param", "sae_features.featviz_steps=2",
               "--batch-size", "6", "--out", str(out), "--workers", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads((out / "results.json").read_text())["analyses"]["sae_features"]["summary"]
    assert found["sae"]["hook"] == "blocks.2.resid_post" and found["cards"]
    assert found["featviz_latents"] == found["cards"]
    assert set(found["class_names"]) == {str(c) for c in found["class_labels"]}  # the COCO categories' names
    assert found["region_names"]["0"].startswith("class00")
    assert (out / "figures" / "sae_features_cards.png").stat().st_size > 0
    assert "sae_features_cards" in (out / "report.html").read_text()
    refused = cli("analyze", "--model", "tiny-vit-sup", "--data", f"{root}::coco", "--analyses", "sae_features",
                  "--out", str(tmp_path / "no"))
    assert refused.returncode != 0 and "needs an SAE" in refused.stdout + refused.stderr


def test_a_batch_keeps_maps_of_its_own_top_k_only_and_codes_ignore_autocast(tmp_path, data) -> None:
    folder = _identity_sae(tmp_path / "sae")
    record, batch = data[0]  # 3 images
    got = SAEFeatures(path=folder, k=2).reduce_hook(HOOK, record[HOOK], batch)
    assert tuple(got["mapped"]["maps"].shape) == (4, 2, 6)  # [latents, k, patches]: never the whole batch
    plain, mixed = SAEFeatures(path=folder, k=2), SAEFeatures(path=folder, k=2)
    for record, batch in data:
        plain.update(record, batch)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # the engine's --dtype: the SAE still encodes in float32
            mixed.update(record, batch)
    for key, value in plain.compute().tensors.items():
        torch.testing.assert_close(mixed.compute().tensors[key], value, rtol=0, atol=0, msg=key)


def test_another_sae_at_the_same_path_keys_another_state(tmp_path) -> None:
    from vitscope.engine.state import run_key

    folder = _identity_sae(tmp_path / "sae")
    before = run_key("model", {}, {"digest": "d"}, [SAEFeatures(path=folder)])
    assert before == run_key("model", {}, {"digest": "d"}, [SAEFeatures(path=folder)])  # read again: the same key
    sae = SparseAutoencoder(4, 4, kind="relu", k=4, seed=1)  # trained again into the same folder
    save(sae, tmp_path / "sae", hook=HOOK, model=SPEC.name)
    after = run_key("model", {}, {"digest": "d"}, [SAEFeatures(path=folder)])
    assert after != before and after["analyses"][0]["config"]["path"] == before["analyses"][0]["config"]["path"]


def test_an_overcomplete_top_k_file_encodes_with_the_k_it_is_given(tmp_path, data) -> None:
    """overcomplete's state dicts do not hold a TopKSAE's k: ``sae_k`` gives it (codes = the k largest of relu)."""
    state = {"encoder.final_block.0.weight": torch.eye(4), "encoder.final_block.0.bias": torch.zeros(4),
             "dictionary._weights": torch.eye(4), "dictionary.multiplier": torch.tensor(0.0)}
    torch.save(state, tmp_path / "topk.pt")
    x = torch.cat([r[HOOK] for r, _ in data])[:, 1:]  # the spatial tokens [5, 6, 4]
    for sae_k, codes in ((None, x.relu()), (1, x.relu() * (x == x.amax(dim=-1, keepdim=True)))):
        acc = SAEFeatures(path=str(tmp_path / "topk.pt"), hook=HOOK, sae_k=sae_k)
        assert acc.why_unsupported(SPEC) is None
        for record, batch in data:
            acc.update(record, batch)
        expected = (codes > 0).double().mean(dim=(0, 1))
        torch.testing.assert_close(acc.compute().tensors["frequency"], expected)
    assert "records its own" in SAEFeatures(path=_identity_sae(tmp_path / "sae"), sae_k=2).why_unsupported(SPEC)
