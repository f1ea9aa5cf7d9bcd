"""Training and zoo edge cases: bf16 metric losses, checkpoint keys and unreadable states, bad settings, zoo list
and a rebuild killed while it ships."""

import json

import pytest
import torch
from typer.testing import CliRunner

from vitscope.cli.main import app
from vitscope.errors import VitscopeError, VitscopeValueError
from vitscope.models.wrap import build_tiny_vit
from vitscope.train.data import TensorImages, synthetic_split
from vitscope.train.embedding import EmbeddingNet, train_embedding
from vitscope.train.loop import LoopConfig, TrainingDivergedError, fit
from vitscope.train.metric import MetricConfig, MetricRecipe
from vitscope.train.supervised import SupervisedConfig, SupervisedRecipe
from vitscope.zoo.catalog import ZooEntry, get_entry
from vitscope.zoo.store import build_model, load_zoo_model, read_manifest, save_weights, sha256, write_manifest

TINY = ZooEntry("test-tiny-ship", "supervised", "tiny-vit",
                {"image_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 10},
                {"warmup": 1}, steps=4, batch_size=16, score="accuracy", data_seed=77, train_images=64,
                snapshot_steps=(2,))


@pytest.fixture(scope="module")
def data() -> TensorImages:
    return synthetic_split(48, seed=3, size=32)


def _vit(**kw):
    return build_tiny_vit("v", image_size=32, depth=2, embed_dim=32, num_heads=2, **kw)


def _metric(data, loss="proxy_anchor"):
    return MetricRecipe(_vit(num_classes=8, global_pool="avg"), int(data.labels.max()) + 1,
                        MetricConfig(loss=loss, lr=0.05))


@pytest.mark.parametrize("loss", ["proxy_anchor", "arcface"])
def test_bf16_metric_training_keeps_loss_parameters_float32_and_resumes_exactly(data, tmp_path, loss):
    def config(ckpt=None):
        return LoopConfig(steps=4, batch_size=16, seed=1, checkpoint_dir=ckpt, checkpoint_every=2, progress=False,
                          autocast="bf16")

    whole_recipe = _metric(data, loss)
    whole = fit(whole_recipe, data, config())
    assert all(p.dtype == torch.float32 for p in whole_recipe.criterion.parameters())
    first = _metric(data, loss)

    def interrupt(step, steps):
        if step == 2:  # after the checkpoint of step 2
            raise KeyboardInterrupt

    first.after_step = interrupt
    with pytest.raises(KeyboardInterrupt):
        fit(first, data, config(tmp_path))
    saved = torch.load(tmp_path / "train_state.pt", weights_only=True)
    assert all(t.dtype == torch.float32 for t in saved["modules"]["loss"].values())
    again = _metric(data, loss)
    resumed = fit(again, data, config(tmp_path))
    assert resumed.resumed_from == 2 and resumed.losses == whole.losses
    for name, module in whole_recipe.modules().items():
        for (k, a), b in zip(module.state_dict().items(), again.modules()[name].state_dict().values(), strict=True):
            assert torch.equal(a, b), f"{name}.{k}"


def test_embedding_pooling_keys_the_checkpoint(data, tmp_path, capsys):
    def run(pooling, ckpt):
        net = train_embedding(_vit(num_classes=0), data, steps=2, batch_size=16, embedding_size=8, pooling=pooling,
                              checkpoint_dir=ckpt, progress=False)
        return net.projection.weight.detach().clone()

    run("mean", tmp_path)
    capsys.readouterr()
    cls = run("cls", tmp_path)
    assert "recipe.embedder.pooling" in capsys.readouterr().err
    assert torch.equal(cls, run("cls", None))


@pytest.mark.parametrize("content", [b"", b"not a checkpoint", "torn", "foreign"])
def test_an_unreadable_training_state_is_ignored_with_one_line(data, tmp_path, capsys, content):
    def run(ckpt):
        recipe = SupervisedRecipe(_vit(num_classes=10), SupervisedConfig(warmup=1))
        return fit(recipe, data, LoopConfig(steps=2, batch_size=16, checkpoint_dir=ckpt, progress=False))

    path = tmp_path / "train_state.pt"
    if content == "torn":
        run(tmp_path)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif content == "foreign":
        torch.save({"x": VitscopeError("not a tensor")}, path)  # a pickle weights_only refuses to read
    else:
        path.write_bytes(content)
    capsys.readouterr()
    result = run(tmp_path)
    err = capsys.readouterr().err
    assert result.resumed_from == 0 and result.losses == run(None).losses
    assert f"ignoring unreadable training state {path}" in err and "starting over" in err
    assert run(tmp_path).resumed_from == 2  # its own state replaced the unreadable one


@pytest.mark.parametrize("change", [{"lr": 0.0}, {"lr": float("nan")}, {"lr": float("inf")}, {"lr": -1.0},
                                    {"loss_lr_factor": 0.0}, {"pct_start": 0.0}, {"pct_start": 1.0},
                                    {"crop_scale": (0.0, 1.0)}, {"crop_scale": (0.8, 0.5)},
                                    {"crop_scale": (0.5, 1.5)}, {"crop_scale": (0.5,)}])
def test_metric_config_refuses_bad_settings_up_front(change):
    with pytest.raises(VitscopeValueError):
        MetricConfig(**change)


def test_bad_embedding_sizes_and_training_sets_are_refused(data):
    with pytest.raises(VitscopeValueError, match="embedding_size"):
        EmbeddingNet(_vit(num_classes=0), embedding_size=0)
    images = data.images[:4]
    with pytest.raises(VitscopeValueError, match="empty"):
        TensorImages(images[:0], torch.zeros(0, dtype=torch.int64))
    with pytest.raises(VitscopeValueError, match="integer"):
        TensorImages(images, torch.zeros(4))
    with pytest.raises(VitscopeValueError, match=">= 0"):
        TensorImages(images, torch.tensor([0, 1, -1, 0]))
    one_class = TensorImages(images, torch.zeros(4, dtype=torch.int64))
    with pytest.raises(VitscopeValueError, match="at least 2"):
        train_embedding(_vit(num_classes=0), one_class, steps=1, batch_size=4, progress=False)
    with pytest.raises(VitscopeValueError, match="at least 2"):
        MetricRecipe(_vit(num_classes=8, global_pool="avg"), 1)


def test_a_diverging_loss_is_a_vitscope_error(data):
    class Diverging(SupervisedRecipe):
        def loss(self, images, labels, step, gen):
            return super().loss(images, labels, step, gen) * float("nan")

    with pytest.raises(TrainingDivergedError, match="loss became nan") as caught:
        fit(Diverging(_vit(num_classes=10)), data, LoopConfig(steps=2, batch_size=16, progress=False))
    assert isinstance(caught.value, VitscopeError) and isinstance(caught.value, FloatingPointError)


def test_zoo_list_names_only_the_checkpoints_built_in_the_folder(tmp_path):
    name = "tiny-vit-metric"
    entry = get_entry(name)
    step = entry.snapshot_steps[0]
    manifest = read_manifest(tmp_path)
    manifest["files"][f"{name}.safetensors"] = save_weights(build_model(entry), tmp_path / f"{name}.safetensors", name)
    manifest["models"][name] = {"params": 1, "score": 0.5, "baselines": {"random_init": 0.1, "raw_pixels": 0.2}}
    write_manifest(tmp_path, manifest)

    def listed():
        rows = json.loads(CliRunner().invoke(app, ["zoo", "list", "--json", "--dir", str(tmp_path)]).output)
        text = CliRunner().invoke(app, ["zoo", "list", "--dir", str(tmp_path)]).output
        return {r["name"]: r for r in rows}[name]["checkpoints"], text.split("Training checkpoints:")[-1]

    checkpoints, text = listed()
    assert checkpoints == [] and "none built" in text and f"{name}@step" not in text
    snap = f"{name}@step{step}"
    manifest["files"][f"{snap}.safetensors"] = save_weights(build_model(entry), tmp_path / f"{snap}.safetensors", snap)
    write_manifest(tmp_path, manifest)
    checkpoints, text = listed()
    assert checkpoints == [snap] and snap in text and f"{name}@step{entry.snapshot_steps[-1]}" not in text


def test_a_rebuild_killed_while_scoring_its_snapshots_keeps_the_last_finished_model(tmp_path, monkeypatch,
                                                                                    small_heldout):
    from vitscope.zoo import build as build_module

    build_module.build(TINY, tmp_path, progress=False)
    before = (tmp_path / "manifest.json").read_text()
    files = json.loads(before)["files"]
    assert set(files) == {"test-tiny-ship.safetensors", "test-tiny-ship@step2.safetensors"}

    def killed(entry, backbone, sets, _score=build_module.score):
        if "@step" in backbone.spec.name:
            raise KeyboardInterrupt  # kill -9 while the new snapshots are scored
        return _score(entry, backbone, sets)

    monkeypatch.setattr(build_module, "score", killed)
    with pytest.raises(KeyboardInterrupt):
        build_module.build(TINY, tmp_path, progress=False, steps=3)
    assert (tmp_path / "manifest.json").read_text() == before
    for fname, checksum in files.items():
        assert sha256(tmp_path / fname) == checksum, fname
        load_zoo_model(fname.removesuffix(".safetensors"), tmp_path, entry=TINY)
    assert not [p.name for p in tmp_path.iterdir() if "staging" in p.name]
