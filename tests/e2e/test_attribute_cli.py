"""``vitscope attribute`` from the command line: maps of every method over the images, raw arrays, results.json and
a report; an embedding model explains its cosine to a --like image; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.cli import cli
from helpers.hf_factories import make


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    paths = []
    for i, (h, w) in enumerate([(64, 64), (48, 80)]):
        paths.append(root / f"photo{i}.png")
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(paths[-1])
    return paths


def test_a_classifier_gets_every_methods_maps_written(images: list[Path], tmp_path: Path) -> None:
    run = cli("attribute", *map(str, images), "-m", "tiny-vit-sup", "--method", "chefer,rollout,input_x_gradient",
              "--target", "2", "-o", str(tmp_path / "out"))
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    summary = doc["analyses"]["attributions"]["summary"]
    assert summary["shapes"] == {"chefer": [8, 8], "rollout": [8, 8], "input_x_gradient": [64, 64]}
    assert summary["classes"] == [2, 2] and summary["score"] == "logit of class 2"
    arrays = np.load(tmp_path / "out" / "arrays" / "attributions.npz")
    assert arrays["chefer"].shape == (2, 8, 8) and np.abs(arrays["chefer"]).max() > 0
    assert (tmp_path / "out" / "figures" / "attributions.png").stat().st_size > 0
    assert "attributions" in (tmp_path / "out" / "report.html").read_text()
    assert run.stdout.strip().splitlines()[-1] == f"report: {tmp_path / 'out' / 'report.html'}"  # as analyze ends
    bad = cli("attribute", str(images[0]), "-m", "tiny-vit-sup", "--method", "lime", "-o", str(tmp_path / "bad"))
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--method must be one of attention" in \
        bad.stderr and "got 'lime'" in bad.stderr


def test_an_embedding_model_explains_its_cosine_to_another_image(images: list[Path], tmp_path: Path) -> None:
    from vitscope.errors import VitscopeValueError
    from vitscope.workflows.attribute import write_attributions

    make("dinov2-reg").save_pretrained(tmp_path / "model")
    doc = write_attributions(str(tmp_path / "model"), images[:1], ["chefer", "token_gradcam"], tmp_path / "out",
                             like=images[1], upsample=True)
    summary = doc["analyses"]["attributions"]["summary"]
    assert summary["score"] == "cosine of the embedding to the --like image's"
    assert summary["shapes"] == {"chefer": [32, 32], "token_gradcam": [32, 32]}  # upsampled to the input
    with pytest.raises(VitscopeValueError, match="has no classifier head: give --like IMAGE"):
        write_attributions(str(tmp_path / "model"), images[:1], ["chefer"], tmp_path / "again")


def test_a_metric_net_is_explained_by_the_cosine_of_its_projected_embeddings(images: list[Path],
                                                                               tmp_path: Path) -> None:
    """The zoo's metric ViT has a linear head that projects its embedding (128 numbers, not classes): it is scored
    like an embedding model, through that projection, and refuses a class."""
    import torch

    import vitscope
    from vitscope.attribution import attribute
    from vitscope.errors import VitscopeValueError
    from vitscope.workflows.attribute import write_attributions

    doc = write_attributions("tiny-vit-metric", images[:1], ["chefer"], tmp_path / "out", like=images[1])
    summary = doc["analyses"]["attributions"]["summary"]
    assert summary["score"] == "cosine of the embedding to the --like image's" and "classes" not in summary
    written = np.load(tmp_path / "out" / "arrays" / "attributions.npz")["chefer"]
    metric = vitscope.load_model("tiny-vit-metric")
    from PIL import Image as PILImage

    pixels = metric.preprocess([PILImage.open(images[0]).convert("RGB")])
    reference = metric.preprocess([PILImage.open(images[1]).convert("RGB")])
    with torch.no_grad(), metric.record("final_norm") as rec:
        metric(reference)
        wanted = metric.model.head(rec["final_norm"][:, 1:].mean(dim=1))[0]  # the net's mean-pooled embedding
    own = attribute(metric, pixels, wanted, "chefer", pooling="mean", projection=metric.model.head)
    np.testing.assert_allclose(written, own.numpy(), rtol=1e-5, atol=1e-7)
    with pytest.raises(VitscopeValueError, match="embedding model .* give --like IMAGE"):
        write_attributions("tiny-vit-metric", images[:1], ["chefer"], tmp_path / "bad", target=3)
    # the metric CNN keeps its projection in ``fc``: scored through it, as paired similarity does
    doc = write_attributions("tiny-resnet-metric", images[:1], ["gradcam"], tmp_path / "cnn", like=images[1])
    assert doc["analyses"]["attributions"]["summary"]["score"] == "cosine of the embedding to the --like image's"
    cnn = vitscope.load_model("tiny-resnet-metric")
    with torch.no_grad():
        wanted = cnn.model(cnn.preprocess([PILImage.open(images[1]).convert("RGB")]))[0]  # its projected embedding
    own = attribute(cnn, cnn.preprocess([PILImage.open(images[0]).convert("RGB")]), wanted, "gradcam",
                    projection=cnn.model.fc)
    np.testing.assert_allclose(np.load(tmp_path / "cnn" / "arrays" / "attributions.npz")["gradcam"], own.numpy(),
                               rtol=1e-5, atol=1e-7)
    with pytest.raises(VitscopeValueError, match="one of --target and --like"):
        write_attributions("tiny-vit-sup", images[:1], ["chefer"], tmp_path / "both", target=3, like=images[1])


@pytest.mark.parametrize(("model", "methods", "needle", "status"), [
    ("tiny-resnet-sup", ["chefer"], "reads attention or tokens, but tiny-resnet-sup is a CNN", 1),
    ("tiny-vit-sup", ["gradcam"], "is for CNNs", 1),
    ("tiny-vit-sup", [], "--method names no method", 2)])
def test_a_method_the_model_cannot_give_is_refused_before_the_folder(images, tmp_path, model, methods, needle,
                                                                     status):
    """The refusal came after --out was made (an empty folder left); no method at all wrote an empty run, exit 0."""
    from typer.testing import CliRunner

    from vitscope.cli.main import app

    proc = CliRunner().invoke(app, ["attribute", str(images[0]), "-m", model, "--method", ",".join(methods) or ",",
                                    "-o", str(tmp_path / "o")])
    assert proc.exit_code == status and needle in proc.stderr, proc.stderr
    assert not (tmp_path / "o").exists()


def test_a_cnn_runs_its_own_methods_by_default_and_a_method_named_twice_runs_once(images, tmp_path):
    """The default methods were a transformer's: every CNN run without --method failed."""
    from vitscope.workflows.attribute import write_attributions

    cnn = write_attributions("tiny-resnet-sup", images[:1], None, tmp_path / "cnn")
    assert cnn["analyses"]["attributions"]["summary"]["methods"] == ["gradcam", "input_x_gradient"]
    twice = write_attributions("tiny-vit-sup", images[:1], ["chefer", "chefer"], tmp_path / "twice")
    assert twice["analyses"]["attributions"]["summary"]["methods"] == ["chefer"]


def test_a_target_for_a_model_without_a_head_is_bad_usage(images, tmp_path):
    from typer.testing import CliRunner

    from vitscope.cli.main import app

    proc = CliRunner().invoke(app, ["attribute", str(images[0]), "-m", "tiny-vit-distill", "--target", "3", "-o",
                                    str(tmp_path / "o")])
    assert proc.exit_code == 2 and "--target names a class of a classifier; tiny-vit-distill has no classifier " \
        "head" in proc.stderr, proc.stderr
