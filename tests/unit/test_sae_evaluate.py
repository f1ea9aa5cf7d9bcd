"""Measuring an SAE: the streamed metrics equal their formulas computed by hand from the recorded tokens, an exact
SAE has no error and no spliced-in cost, and the controls (mean, PCA) sit beside it."""

from __future__ import annotations

import pytest
import torch

import vitscope
from vitscope.analyses.activations.hook_tensors import HookTensors
from vitscope.data.synthetic.write import synthesize
from vitscope.sae import SparseAutoencoder
from vitscope.sae.evaluate import evaluate

HOOK = "blocks.2.resid_post"


@pytest.fixture(scope="module")
def setting(tmp_path_factory: pytest.TempPathFactory):
    world = f"{synthesize(tmp_path_factory.mktemp('ev') / 'world', 'coco', n=6, size=64, seed=12)}::coco"
    backbone = vitscope.load_model("tiny-vit-sup")
    tokens = vitscope.run(backbone, world, [HookTensors([HOOK])],
                          batch_size=3, progress=False, workers=0)["hook_tensors"].tensors[HOOK][:, 1:]
    return world, backbone, tokens.reshape(-1, tokens.shape[-1]).double()


def _exact(d: int) -> SparseAutoencoder:
    """relu(x) - relu(-x) = x: an SAE of 2d latents that reconstructs every token exactly."""
    sae = SparseAutoencoder(d, 2 * d, kind="relu")
    eye = torch.eye(d)
    with torch.no_grad():
        sae.W_enc.copy_(torch.cat([eye, -eye], dim=1))
        sae.W_dec.copy_(torch.cat([eye, -eye], dim=0))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return sae


def test_an_exact_sae_has_no_error_and_costs_nothing(setting) -> None:
    world, backbone, x = setting
    found = evaluate(_exact(128), backbone, world, hook=HOOK, images=4)
    assert found["tokens"] == len(x) and found["fvu"] < 1e-10 and found["cosine"] == pytest.approx(1.0)
    assert found["spliced"]["sae"]["knn_change"] == 0.0  # the same features: the same neighbours
    assert 0.0 <= found["knn_accuracy"] <= 1.0 and "knn_accuracy" in found["spliced"]["mean"]
    assert found["l0"] == pytest.approx(float((x != 0).sum()) / len(x))
    assert found["spliced"]["sae"]["output_kl"] < 1e-6 and found["spliced"]["sae"]["top1_kept"] == 1.0
    assert found["spliced"]["mean"]["output_kl"] > 1e-3  # the control costs something


def test_the_metrics_are_their_formulas(setting) -> None:
    world, backbone, x = setting
    sae = SparseAutoencoder(128, 64, kind="topk", k=4, seed=3)
    with torch.no_grad():
        sae.b_dec.copy_(x.mean(dim=0).float())
    found = evaluate(sae, backbone, world, hook=HOOK, images=2, dense_above=0.2, knn=False)
    with torch.no_grad():
        codes = sae.encode(x.float()).double()
        x_hat = sae.decode(codes.float()).double()
    fvu = float(((x - x_hat) ** 2).sum() / ((x - x.mean(dim=0)) ** 2).sum())
    assert found["fvu"] == pytest.approx(fvu, rel=1e-5)
    assert found["cosine"] == pytest.approx(float(torch.nn.functional.cosine_similarity(x, x_hat, dim=-1).mean()),
                                            rel=1e-5)
    assert found["l0"] == 4.0
    fired = (codes > 0).sum(dim=0)
    assert found["dead"] == int((fired == 0).sum()) and found["dense"] == int((fired > 0.2 * len(x)).sum())
    assert set(found["spliced"]) == {"sae", "mean", "pca"}


def test_an_sae_of_another_width_model_or_hook_is_one_line(setting) -> None:
    world, backbone, _ = setting
    with pytest.raises(ValueError, match="has 128 channels but the SAE reads 64"):
        evaluate(SparseAutoencoder(64, 32), backbone, world, hook=HOOK)
    other = SparseAutoencoder(128, 32)
    other.model, other.hook = "dinov2-vits14", HOOK
    with pytest.raises(ValueError, match="trained on dinov2-vits14, not tiny-vit-sup"):
        evaluate(other, backbone, world)
    with pytest.raises(ValueError, match=r"does not name the hook it reads: give it \(--hook, or hook=\)"):
        evaluate(SparseAutoencoder(128, 32), backbone, world)  # not "has no hook None"
    with pytest.raises(ValueError, match="has no hook 'blocks.99.resid_post' for this SAE"):
        evaluate(SparseAutoencoder(128, 32), backbone, world, hook="blocks.99.resid_post")


def test_the_command_prints_the_metrics(setting, tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from vitscope.cli.main import app
    from vitscope.sae import save

    world, _, x = setting
    save(_exact(128), tmp_path / "sae", hook=HOOK, model="tiny-vit-sup")
    result = CliRunner().invoke(app, ["sae", "eval", "--sae", str(tmp_path / "sae"), "--model", "tiny-vit-sup",
                                      "--data", world, "--images", "2"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)  # stdout is the JSON alone; the model's input line goes to stderr
    assert result.stderr.startswith("tiny-vit-sup: input ")
    assert found["tokens"] == len(x) and found["fvu"] < 1e-10 and set(found["spliced"]) == {"sae", "mean", "pca"}


def test_steering_and_ablating_latents_beside_their_controls(setting) -> None:
    from vitscope.models.outputs import edited_readout, output_change
    from vitscope.sae.edits import ablate_latents, random_direction, steer_latent

    world, backbone, x = setting
    sae = _exact(128)
    pixels = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    clean = edited_readout(backbone, pixels)
    steered = edited_readout(backbone, pixels, steer_latent(sae, HOOK, 5, 20.0))
    control = edited_readout(backbone, pixels, steer_latent(sae, HOOK, 5, 20.0, random_direction(sae, 5, seed=1)))
    assert output_change(backbone, clean, steered)["output_kl"] > 0 and not torch.equal(steered, control)
    assert float(random_direction(sae, 5).norm()) == pytest.approx(float(sae.W_dec[5].detach().norm()))
    with torch.no_grad(), backbone.intervene(ablate_latents(sae, HOOK, [0, 1, 2], ("cls",))), \
            backbone.record([HOOK]) as rec:
        backbone(pixels)
        ablated = rec[HOOK][:, 1:].clone()
    with torch.no_grad(), backbone.record([HOOK]) as rec:
        backbone(pixels)
        plain = rec[HOOK][:, 1:].clone()
    # the exact SAE's latents 0-2 are the positive parts of channels 0-2: ablating them clips those channels at 0
    torch.testing.assert_close(ablated[..., :3], plain[..., :3].clamp(max=0))
    torch.testing.assert_close(ablated[..., 3:], plain[..., 3:])
    with pytest.raises(ValueError, match="not latents of this SAE"):
        steer_latent(sae, HOOK, 999, 1.0)
    narrow = _exact(64)  # of another model's width: refused in one line, not a shape error deep in the forward
    for edits in (steer_latent(narrow, HOOK, 5, 1.0), ablate_latents(narrow, HOOK, [0], ("cls",))):
        with pytest.raises(ValueError, match=f"the SAE reads 64 channels, but '{HOOK}' has 128"), torch.no_grad(), \
                backbone.intervene(edits):
            backbone(pixels)


def test_the_tokens_it_was_trained_on_are_those_measured_unless_told(setting) -> None:
    world, backbone, x = setting
    sae = _exact(128)
    sae.tokens_of = "cls"  # as load() reads it from a file trained on the CLS tokens
    found = evaluate(sae, backbone, world, hook=HOOK, images=2, knn=False)
    assert found["tokens_of"] == "cls" and found["tokens"] == 6  # one per image
    told = evaluate(sae, backbone, world, hook=HOOK, tokens_of="spatial", images=2, knn=False)
    assert told["tokens_of"] == "spatial" and told["tokens"] == len(x)


def test_tokens_the_model_does_not_have_are_one_line(setting) -> None:
    world, backbone, _ = setting
    with pytest.raises(ValueError, match="tiny-vit-sup has no registers: tokens_of 'registers' selects no token"):
        evaluate(_exact(128), backbone, world, hook=HOOK, tokens_of="registers", images=2, knn=False)


def test_ablating_edits_the_tokens_the_sae_was_trained_on_unless_told(setting) -> None:
    from vitscope.sae.edits import ablate_latents

    _, backbone, _ = setting
    sae = _exact(128)
    sae.tokens_of = "cls"  # as load() reads it from a file trained on the CLS tokens
    pixels = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad(), backbone.record([HOOK]) as rec:
        backbone(pixels)
        plain = rec[HOOK].clone()
    for told, edited in ((None, slice(0, 1)), ("spatial", slice(1, None))):
        with torch.no_grad(), backbone.intervene(ablate_latents(sae, HOOK, [0, 1, 2], ("cls",), tokens_of=told)), \
                backbone.record([HOOK]) as rec:
            backbone(pixels)
            ablated = rec[HOOK].clone()
        expected = plain.clone()
        expected[:, edited, :3] = plain[:, edited, :3].clamp(max=0)  # the exact SAE's latents 0-2: channels 0-2 > 0
        torch.testing.assert_close(ablated, expected)


def test_an_sae_of_a_cnn_map_reads_edits_and_measures_every_position(setting) -> None:
    """A CNN's ``[B, C, H, W]`` map is a token of C channels per position, as the SAE was trained on it."""
    from vitscope.models.outputs import edited_readout, output_change
    from vitscope.sae.edits import ablate_latents, steer_latent

    world = setting[0]
    cnn = vitscope.load_model("tiny-resnet")
    maps = vitscope.run(cnn, world, [HookTensors(["stages.2"])], batch_size=3, progress=False,
                        workers=0)["hook_tensors"].tensors["stages.2"]
    x = maps.flatten(2).transpose(1, 2).reshape(-1, maps.shape[1]).double()  # [images * H * W, 128]
    sae = SparseAutoencoder(128, 64, kind="topk", k=4, seed=3)
    with torch.no_grad():
        sae.b_dec.copy_(x.mean(dim=0).float())
        x_hat = sae(x.float()).double()
    found = evaluate(sae, cnn, world, hook="stages.2", images=2, knn=False)
    assert found["tokens"] == len(x) and found["l0"] == 4.0
    assert found["fvu"] == pytest.approx(float(((x - x_hat) ** 2).sum() / ((x - x.mean(dim=0)) ** 2).sum()), rel=1e-5)
    exact = evaluate(_exact(128), cnn, world, hook="stages.2", images=2, knn=False)
    assert exact["fvu"] < 1e-10 and exact["spliced"]["sae"]["output_kl"] < 1e-6
    assert exact["spliced"]["sae"]["top1_kept"] == 1.0 and exact["spliced"]["mean"]["output_kl"] > 0
    pixels = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(edited_readout(cnn, pixels), cnn(pixels).float())  # its own logits
    assert output_change(cnn, edited_readout(cnn, pixels),
                         edited_readout(cnn, pixels, {"features": lambda t, name: t * 0}))["output_kl"] > 0
    with torch.no_grad(), cnn.record(["stages.2"]) as rec:
        cnn(pixels)
        plain = rec["stages.2"].clone()
    with torch.no_grad(), cnn.intervene(ablate_latents(_exact(128), "stages.2", [0, 1, 2], ())), \
            cnn.record(["stages.2"]) as rec:
        cnn(pixels)
        ablated = rec["stages.2"].clone()
    torch.testing.assert_close(ablated[:, :3], plain[:, :3].clamp(max=0))  # every position's channels 0-2
    torch.testing.assert_close(ablated[:, 3:], plain[:, 3:])
    with torch.no_grad(), cnn.intervene(steer_latent(_exact(128), "stages.2", 5, 20.0)), \
            cnn.record(["stages.2"]) as rec:
        cnn(pixels)
        steered = rec["stages.2"].clone()
    expected = plain.clone()
    expected[:, 5] += 20.0  # the exact SAE's latent 5 decodes to channel 5
    torch.testing.assert_close(steered, expected)


def test_the_pca_control_is_fitted_on_every_streamed_token() -> None:
    """The control's basis: the top principal directions of the streamed tokens' covariance, so it reconstructs
    tokens of a subspace of that dimension exactly and drops what lies across it."""
    from vitscope.sae.evaluate import _replacements

    gen = torch.Generator().manual_seed(0)
    plane = torch.linalg.qr(torch.randn(6, 2, generator=gen)).Q  # [6, 2]: an orthonormal plane
    centre = torch.randn(6, generator=gen)
    tokens = (torch.randn(500, 2, generator=gen) * torch.tensor([3.0, 2.0])) @ plane.T + centre
    mean = tokens.double().mean(dim=0)
    covariance = tokens.double().T @ tokens.double() / len(tokens) - torch.outer(mean, mean)
    pca = _replacements(_exact(128), mean.float(), covariance, components=2)["pca"]
    torch.testing.assert_close(pca(tokens[:5]), tokens[:5], atol=1e-4, rtol=0)
    across = torch.linalg.qr(torch.cat([plane, torch.randn(6, 1, generator=gen)], dim=1)).Q[:, 2]
    torch.testing.assert_close(pca(tokens[:5] + across), tokens[:5], atol=1e-4, rtol=0)
    first = _replacements(_exact(128), mean.float(), covariance, components=1)["pca"]
    assert float(((first(tokens) - tokens) ** 2).sum()) < float(((tokens - tokens.mean(0)) ** 2).sum()) / 2
