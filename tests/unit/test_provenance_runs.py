"""Runs record the settings they chose for the user: compare's probe settings and pooled tokens, the explanations'
method parameters, robustness's batch size and device, every model's attention kernel, and the report shows the
resolved device and workers and each model's preprocessing."""

from __future__ import annotations

import json

import pytest

from vitscope.data.synthetic.write import synthesize


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    """The synthetic world as COCO: 10 images of 32 px with masks and labels."""
    return synthesize(tmp_path_factory.mktemp("prov_runs") / "coco", "coco", n=10, size=32, seed=0)


def test_compare_records_its_probe_settings_and_the_token_each_model_was_pooled_from(coco, tmp_path):
    from vitscope import compare_models
    from vitscope.data.load import load_dataset

    compare_models(["tiny-vit-sup", "tiny-resnet-sup"], f"{coco}::coco", tmp_path, analyses=[], device="cpu")
    doc = json.loads((tmp_path / "results.json").read_text())
    settings = doc["analyses"]["compare"]["summary"]["probe_settings"]
    labels = load_dataset(coco, "coco").labels
    assert settings["seed"] == 0 and settings["test_fraction"] == 0.2
    assert settings["knn"] == {"k": 20, "temperature": 0.07}
    vit, cnn = settings["models"]["tiny-vit-sup"], settings["models"]["tiny-resnet-sup"]
    assert vit["pooling"] == "cls" and cnn["pooling"] == "mean"  # a CNN has no CLS token
    assert vit["clusters"] == len(set(labels[labels >= 0].tolist()))
    assert vit["num_train"] + vit["num_test"] == int((labels >= 0).sum()) and vit["num_test"] > 0
    report = (tmp_path / "report.html").read_text()
    assert "Probe settings" in report and "temperature 0.07" in report
    assert doc["models"][0]["attention_kernel"] == "sdpa" and "attention_kernel" not in doc["models"][1]


def test_explanations_record_the_fixed_settings_of_their_methods_and_the_data_as_analyze_does(coco, tmp_path):
    from vitscope.explain.benchmark import method_parameters
    from vitscope.workflows.explanations import run_explanations

    doc = run_explanations(["tiny-vit-sup"], f"{coco}::coco", tmp_path, methods=["attention"], limit=2, steps=2)
    params = doc["analyses"]["explanations"]["summary"]["method_params"]
    assert method_parameters(["integrated_gradients"], faithful=False, sanity=False) == {
        "integrated_gradients": {"baseline": 0.0, "steps": 32}}
    assert params["attention"] == {} and "integrated_gradients" not in params
    assert params["sanity"] == {"seed": 0, "threshold": 0.5}
    assert params["faithfulness"] == {"fills": ["mean", "road"], "seed": 0, "noise": 0.01}
    data = doc["data"]
    assert data["format"] == "coco" and data["split"] == "val2017" and data["decode"] == "full"
    assert data["fingerprint"]["digest"] and data["classes"]


def test_robustness_records_its_batch_size_and_the_device_it_ran_on(coco, tmp_path):
    from vitscope.experiments.robustness import run_robustness

    doc = run_robustness(["tiny-vit-sup"], f"{coco}::coco", tmp_path, batch_size=3, limit=4)
    assert doc["config"]["batch_size"] == 3 and doc["config"]["device"] == "auto"
    assert doc["run"]["device"]["device"] in ("cpu", "cuda:0") and doc["run"]["workers"] is not None
    report = (tmp_path / "report.html").read_text()
    assert "Attention kernel" in report and "auto (resolved: " in report  # the device, as it ran


def test_the_attention_kernel_is_the_one_the_model_runs(tmp_path):
    import transformers as tf

    from vitscope.engine.provenance import attention_kernels
    from vitscope.models.load import load_model

    tiny = load_model("tiny-vit-sup")
    assert attention_kernels(tiny)["attention_kernel"] == "sdpa"
    for block in tiny.model.blocks:
        block.attn.fused_attn = False  # timm's explicit path
    assert attention_kernels(tiny)["attention_kernel"] == "eager"
    assert attention_kernels(load_model("tiny-resnet-sup")) == {}
    config = tf.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                          image_size=32, patch_size=8)
    tf.ViTModel(config, add_pooling_layer=False).save_pretrained(tmp_path / "vit")
    hf = load_model(str(tmp_path / "vit"))
    for kernel in ("sdpa", "eager"):
        hf.model.config._attn_implementation = kernel  # as from_pretrained(attn_implementation=...) sets it
        found = attention_kernels(hf)
        assert found["attention_kernel"] == kernel and found["pattern_kernel"].startswith("vitscope_record")


def test_the_report_shows_what_the_run_resolved_and_each_models_preprocessing():
    from vitscope.report.sections import resolved_config, summary_rows

    doc = {"config": {"device": "auto", "workers": None, "batch_size": 16},
           "run": {"device": {"device": "cuda:0", "name": "NVIDIA H200", "cuda": "12.4"}, "workers": 4},
           "models": [{"id": "m", "image_size": [224, 224], "resize_size": 256, "interpolation": "bicubic",
                       "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "attention_kernel": "sdpa",
                       "pattern_kernel": "vitscope_record"}],
           "data": {"name": "coco:val2017", "format": "coco", "split": "val2017", "label_rule": "largest annotation",
                    "classes": ["cat", "dog"]}}
    config = resolved_config(doc)
    assert config["device"] == "auto (resolved: cuda:0 (NVIDIA H200, CUDA 12.4))"
    assert config["workers"] == "null (resolved: 4)" and config["batch_size"] == 16
    rows = dict(summary_rows(doc))
    assert rows["Preprocessing"] == ("input 224x224 px, resize to 256 px (short side), bicubic interpolation, "
                                     "mean 0.485, 0.456, 0.406, std 0.229, 0.224, 0.225")
    assert rows["Attention kernel"] == "sdpa; patterns: vitscope_record"
    assert rows["Data format"] == "coco, split val2017" and rows["Labels"] == "largest annotation; 2 classes (cat, dog)"


def test_explanations_take_each_model_and_method_once(coco, tmp_path):
    """A model listed twice failed after every score, at the writer, leaving an empty folder; a method listed twice
    was recorded twice."""
    from vitscope.errors import VitscopeUsageError
    from vitscope.workflows.explanations import run_explanations

    for models, said in ((["tiny-vit-sup", "tiny-vit-sup"], "'tiny-vit-sup' is listed twice in --models"),
                         (["zoo/a", "zoo_a"], "'zoo/a' and 'zoo_a' would share file names")):
        with pytest.raises(VitscopeUsageError, match=said):
            run_explanations(models, f"{coco}::coco", tmp_path / "refused", methods=["attention"], limit=2, steps=2)
        assert not (tmp_path / "refused").exists()
    doc = run_explanations(["tiny-vit-sup"], f"{coco}::coco", tmp_path / "once", methods=["attention", "attention"],
                           limit=2, steps=2)
    assert doc["analyses"]["explanations"]["summary"]["methods"] == ["attention"]
