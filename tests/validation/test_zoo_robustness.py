"""Issue 10's ViT-beside-CNN measurements on the tiny zoo (paper 001 section 5, tables 2 and 3).

tiny-vit-sup and tiny-resnet-sup classify held-out synthetic scenes; masking the foreground box or filtering
in the Fourier domain must behave as the world was built: the object carries the class, the background
carries none (unless the world ties it to the class), and the coarse shape survives a strong low-pass.
"""

import os

import pytest

import vitscope
from vitscope.analyses.masking.foreground import ForegroundMasking
from vitscope.analyses.masking.frequency import FrequencyFiltering
from vitscope.data import load_dataset
from vitscope.data.annotated_source import AnnotatedSource
from vitscope.data.synthetic.write import synthesize

pytestmark = pytest.mark.skipif(os.environ.get("VITSCOPE_ZOO_CHECK") != "1",
                                reason="make zoo-check measures the zoo under masking and filtering (10 s; the "
                                       "suite checks their geometry, limits and merges)")

FRACTIONS = (0.05, 0.3)  # cut-off radius as a fraction of half the image side: 1.6 px and 9.6 px


def _measure(name: str, source: AnnotatedSource, frequency: bool = True, **foreground) -> dict:
    backbone = vitscope.load_model(name)
    analyses = [ForegroundMasking(**foreground)] + ([FrequencyFiltering(FRACTIONS)] if frequency
                                                              else [])
    res = vitscope.run(backbone, source, analyses, batch_size=64, progress=False)
    fg = res["foreground_masking"]
    out = {"full": float(fg["accuracy"][0, 0]), "foreground": float(fg["normalised_accuracy"][1, 0]),
           "background": float(fg["accuracy"][2, 0])}
    if frequency:
        out |= {"low": res["frequency_filtering"]["accuracy"][0].tolist(),
                "high": res["frequency_filtering"]["accuracy"][1].tolist()}
    return out


@pytest.fixture(scope="module")
def clean_world(tmp_path_factory):
    root = synthesize(tmp_path_factory.mktemp("rob"), "coco", n=160, size=64, seed=4242)
    return AnnotatedSource(load_dataset(root, format="coco"))


@pytest.fixture(scope="module")
def measured(clean_world):
    return {name: _measure(name, clean_world) for name in ("tiny-vit-sup", "tiny-resnet-sup")}


@pytest.mark.parametrize("name", ["tiny-vit-sup", "tiny-resnet-sup"])
def test_the_object_carries_the_class_and_the_background_none(measured, name):
    m = measured[name]
    assert m["full"] >= 0.85, m
    assert m["foreground"] >= 0.85, m  # foreground only, normalised by the full-image accuracy
    assert m["background"] <= 0.3, m  # 10 classes: chance is 0.1; backgrounds are independent of the class


@pytest.mark.parametrize("name", ["tiny-vit-sup", "tiny-resnet-sup"])
def test_shape_survives_a_low_pass_and_not_a_high_pass(measured, name):
    m = measured[name]
    assert m["low"][1] >= 0.9 * m["full"], m
    assert m["high"][1] <= 0.3, m


def test_the_vit_relies_less_on_high_frequencies_than_the_cnn(measured):
    # paper 001: ViTs keep more accuracy when high frequencies are removed (measured 0.63 against 0.46 on
    # 400 held-out scenes at a 1.6 px cut-off)
    vit, cnn = measured["tiny-vit-sup"], measured["tiny-resnet-sup"]
    assert vit["low"][0] - cnn["low"][0] >= 0.1, (vit, cnn)


def test_the_spurious_model_leans_on_the_background_it_was_trained_with(tmp_path):
    # On a world whose background type follows the class in 90% of scenes. Object masks filled with the mean
    # colour: black boxes cover half the image and push both models to one class (background-only 0.16 for
    # the spurious model with zero-filled boxes), and a blurred fill leaves the object's silhouette at 64 px
    # (0.83 for the clean model), so neither isolates the background here.
    source = AnnotatedSource(load_dataset(synthesize(tmp_path, "coco", n=160, size=64, seed=4242, spurious=0.9),
                                          format="coco"))
    spurious = _measure("tiny-vit-sup-spurious", source, frequency=False, region="mask", fill="mean")
    clean = _measure("tiny-vit-sup", source, frequency=False, region="mask", fill="mean")
    assert spurious["background"] - clean["background"] >= 0.08, (spurious, clean)  # measured 0.30 and 0.10
    assert clean["foreground"] - spurious["foreground"] >= 0.05, (spurious, clean)  # measured 1.01 and 0.76
