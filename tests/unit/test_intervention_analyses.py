"""head_importance and logit_lens against the same quantities computed by hand with ``backbone.intervene`` and
the model's own parts."""

from __future__ import annotations

import pytest
import torch

import vitscope
from vitscope.analyses import ANALYSES
from vitscope.data.synthetic.write import synthesize
from vitscope.interventions import ablate_heads

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"{synthesize(tmp_path_factory.mktemp('world') / 'coco', 'coco', n=6, size=64, seed=2)}::coco"


@pytest.fixture(scope="module")
def model():
    return vitscope.load_model("tiny-vit-sup")


def images_and_labels(model, world: str):
    from vitscope.data.open import as_source

    source = as_source(world)
    loaded = [source.load_checked(i) for i in range(len(source))]
    return model.preprocess([image for image, _ in loaded]), torch.as_tensor([t["label"] for _, t in loaded])


def test_head_importance_is_the_drop_of_the_labels_logit_under_each_control(model, world):
    analysis = ANALYSES["head_importance"](blocks=(2,), reference_images=3)
    result = vitscope.run(model, world, [analysis], batch_size=4, progress=False)["head_importance"]
    x, y = images_and_labels(model, world)
    with torch.no_grad():
        clean = model(x).gather(1, y[:, None])[:, 0]
        with model.record("blocks.2.attn.heads") as rec:
            model(x[:3])  # the reference set: the first three images
        reference = rec["blocks.2.attn.heads"].clone()
        for head in range(model.spec.num_heads):
            expected = {}
            for control in ("zero", "mean", "resample"):
                if control == "resample":  # image j takes reference image (j + 1) mod 3
                    other = reference[torch.as_tensor([(j + 1) % 3 for j in range(len(x))])]

                    def edit(t, n, _h=head, _o=other):
                        t = t.clone()
                        t[:, _h] = _o[:, _h]
                        return t
                    edits = {"blocks.2.attn.heads": edit}
                else:
                    means = {"blocks.2.attn.heads": reference.mean(0)}
                    edits = ablate_heads({2: [head]}, mode=control, reference=means if control == "mean" else None)
                with model.intervene(edits):
                    ablated = model(x).gather(1, y[:, None])[:, 0]
                expected[control] = float((clean - ablated).mean())
                assert float(result.tensors[control][0, head]) == pytest.approx(expected[control], abs=1e-5)
    assert result.meta["output"] == "logit of the label" and result.meta["controls"] == ["zero", "mean", "resample"]
    assert {f.stem for f in result.figures()} == {f"head_importance_{c}" for c in ("zero", "mean", "resample")}


def test_the_reference_set_stays_within_the_runs_limit(model, world):
    """``limit`` bounds every image the run reads: a reference set of 16 asked on a run of 2 images is those 2 (the
    numbers of a reference set of 2), and the resample control refuses a run of one image, which would take its
    own output."""
    from vitscope.errors import VitscopeValueError

    runs = [vitscope.run(model, world, [ANALYSES["head_importance"](blocks=(2,), reference_images=r)], batch_size=2,
                         limit=2, progress=False, workers=0)["head_importance"] for r in (16, 2)]
    for control in ("mean", "resample"):
        torch.testing.assert_close(runs[0].tensors[control], runs[1].tensors[control])
    with pytest.raises(VitscopeValueError, match="two reference images"):
        vitscope.run(model, world, [ANALYSES["head_importance"](blocks=(2,))], limit=1, progress=False, workers=0)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(VitscopeValueError, match="limit must be a whole number"):
            vitscope.run(model, world, ["attention_distance"], limit=bad, progress=False, workers=0)


def test_the_reference_set_is_made_into_inputs_by_the_runs_view(model, world):
    """Under a view the reference head outputs are those of the images as the pass preprocesses them (they were
    recorded with the model's own preprocessing)."""
    from vitscope.analyses.activations.hook_tensors import HookTensors
    from vitscope.models.views import FrameView

    class Kept(ANALYSES["head_importance"]):
        def set_reference(self, activations):
            self.kept = {k: v.clone() for k, v in activations.items()}
            super().set_reference(activations)

    view, hook = FrameView(short_side=48, multiple=16), "blocks.2.attn.heads"  # 64 px scenes at 48 px
    spy = Kept(controls=("mean",), reference_images=3, blocks=(2,))
    vitscope.run(model, world, [spy], batch_size=3, view=view, progress=False, workers=0, limit=4)
    seen = {v: vitscope.run(model, world, [HookTensors([hook])], batch_size=3, view=v, progress=False, workers=0,
                            limit=3)["hook_tensors"].tensors[hook] for v in (view, None)}
    assert seen[view].shape != seen[None].shape  # the view changes the inputs
    torch.testing.assert_close(spy.kept[hook], seen[view], rtol=0, atol=1e-6)


def test_logit_lens_reads_every_block_with_the_models_own_head(model, world):
    result = vitscope.run(model, world, ["logit_lens"], batch_size=4, progress=False)["logit_lens"]
    x, y = images_and_labels(model, world)
    blocks = [f"blocks.{i}.resid_post" for i in range(model.spec.num_blocks)]
    with torch.no_grad(), model.record(blocks) as rec:
        final = model(x)
        per_block = [model.head(model.final_norm(rec[name])) for name in blocks]
    agreement = torch.stack([(p.argmax(-1) == final.argmax(-1)).double().mean() for p in per_block])
    accuracy = torch.stack([(p.argmax(-1) == y).double().mean() for p in per_block])
    kl = torch.stack([torch.nn.functional.kl_div(p.log_softmax(-1), final.log_softmax(-1), log_target=True,
                                                 reduction="batchmean") for p in per_block]).double()
    torch.testing.assert_close(result.tensors["agreement"], agreement)
    torch.testing.assert_close(result.tensors["accuracy"], accuracy)
    torch.testing.assert_close(result.tensors["kl"], kl, atol=1e-5, rtol=1e-4)
    assert float(result.tensors["agreement"][-1]) == 1.0 and result.meta["mode"] == "classifier"
    from helpers.hf_factories import make

    embedding = vitscope.run(vitscope.wrap(make("dinov2-reg"), name="dinov2-reg"), world, ["logit_lens"],
                             batch_size=4, progress=False)["logit_lens"]  # no classifier: its pooled CLS token
    assert embedding.meta["mode"] == "embedding" and float(embedding.tensors["cosine"][-1]) == pytest.approx(1.0)


def test_an_image_without_a_label_is_scored_by_its_prediction_whatever_the_batch(model, tmp_path):
    """Labels are read image by image: an unlabelled image (-1) takes its predicted class in head_importance and
    is left out of logit_lens's accuracy, and its batch's labelled images count as any others, at every batch
    size."""
    import numpy as np
    from PIL import Image

    from vitscope.data.files import ImageFiles

    rng = np.random.default_rng(3)
    paths = []
    for i in range(6):
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(paths[-1])
    x = model.preprocess([Image.open(p) for p in paths])
    with torch.no_grad():
        final = model(x)
    predicted, classes = final.argmax(-1), final.shape[-1]
    labels = [int(predicted[0]), (int(predicted[1]) + 1) % classes, -1, int(predicted[3]),
              (int(predicted[4]) + 1) % classes, int(predicted[5])]
    target = torch.as_tensor([v if v >= 0 else int(predicted[j]) for j, v in enumerate(labels)])
    with torch.no_grad():
        clean = final.gather(1, target[:, None])[:, 0]
        zero = []
        for head in range(model.spec.num_heads):
            with model.intervene(ablate_heads({2: [head]}, mode="zero")):
                zero.append(float((clean - model(x).gather(1, target[:, None])[:, 0]).mean()))
        blocks = [f"blocks.{i}.resid_post" for i in range(model.spec.num_blocks)]
        with model.record(blocks) as rec:
            model(x)
            per_block = [model.head(model.final_norm(rec[name])).argmax(-1) for name in blocks]
    have = [j for j, v in enumerate(labels) if v >= 0]
    accuracy = torch.stack([(p[have] == torch.as_tensor(labels)[have]).double().mean() for p in per_block])
    assert float(accuracy[-1]) == pytest.approx(0.6)
    for batch_size in (4, 2):
        got = vitscope.run(model, ImageFiles([str(p) for p in paths], labels=labels),
                           [ANALYSES["head_importance"](controls=("zero",), blocks=(2,), reference_images=2),
                            "logit_lens"], batch_size=batch_size, progress=False, workers=0)
        heads, lens = got["head_importance"], got["logit_lens"]
        torch.testing.assert_close(heads.tensors["zero"][0], torch.as_tensor(zero, dtype=torch.float64),
                                   atol=1e-5, rtol=1e-5, msg=str(batch_size))
        assert float(heads.tensors["clean_output"]) == pytest.approx(float(clean.mean()), abs=1e-5)
        assert (heads.meta["labelled_images"], heads.meta["predicted_images"]) == (5, 1)
        assert heads.meta["output"] == "logit of the label (of the predicted class for images without one)"
        torch.testing.assert_close(lens.tensors["accuracy"], accuracy, msg=str(batch_size))
        assert lens.meta["labelled_images"] == 5


@pytest.mark.parametrize(("output", "effect"), [
    ("logit of the label", "drop of the logit of the label"),
    ("cosine to the unedited embedding", "1 - cosine to the unedited embedding"),
])
def test_head_importance_maps_name_what_their_cells_hold(monkeypatch, tmp_path, output, effect):
    """Each cell is ``clean - ablated`` (the drop), not the output itself: the title, the hover's and the colour
    bar's labels say so."""
    from vitscope.analyses.interventions.head_importance import HeadImportanceResult

    drop = torch.tensor([[0.25, -0.5]], dtype=torch.float64)
    result = HeadImportanceResult("head_importance", {"zero": drop}, {"output": output, "controls": ["zero"],
                                                                      "num_images": 8, "blocks": [3]})
    (figure,) = result.figures()
    (panel,) = figure.chart.panels
    assert panel.value_label == effect and panel.title == f"Head ablation (zero): {effect}, 8 images"
    assert panel.values == [[0.25, -0.5]]
    drawn = []
    monkeypatch.setattr("vitscope.viz.heatmaps.save_figure", lambda fig, *a, **k: drawn.append(fig) or [])
    figure.draw(tmp_path / "f")
    (bar,) = [ax for ax in drawn[0].axes if ax.get_label() == "<colorbar>"]
    assert bar.get_ylabel() == effect and " ".join(drawn[0].axes[0].get_title().split()) == panel.title
