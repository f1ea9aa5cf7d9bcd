"""How ``--models`` entries name their models (vitscope.comparison.names)."""

from __future__ import annotations

import pytest

from vitscope.comparison.names import file_safe, named_models


def test_a_plain_name_before_the_first_equals_sign_names_the_model() -> None:
    assert named_models(["dino=hf:facebook/dinov2-small", "tiny-vit"]) == [
        ("dino", "hf:facebook/dinov2-small"), ("tiny-vit", "tiny-vit")]
    assert named_models(["v1.5_b-2=runs/a=b", "x=y"]) == [("v1.5_b-2", "runs/a=b"), ("x", "y")]  # split once


@pytest.mark.parametrize("entry", ["hf:org/model=v2", "./runs/a=b", "/data/m=1", "2x=model", "a b=c"])
def test_an_entry_without_a_plain_name_is_the_model_itself(entry: str) -> None:
    assert named_models([entry, "tiny-vit"])[0] == (entry, entry)


def test_a_mapping_names_its_models_as_they_are() -> None:
    assert named_models({"DINO v2": "hf:facebook/dinov2-small", "vit": "tiny-vit"}) == [
        ("DINO v2", "hf:facebook/dinov2-small"), ("vit", "tiny-vit")]


@pytest.mark.parametrize("models, needle", [
    (["a=x", "a=y"], "two models are named 'a'"),
    (["x", "x"], "'x' is listed twice"),
    (["a=x", "x", "a"], "two models are named 'a'"),
    (["x"], "at least two models"),
    (["a=", "b=y"], "names no model"),
    ({"a/b": "x", "a_b": "y"}, "would share file names"),
])
def test_names_are_unique_and_name_something(models, needle) -> None:
    with pytest.raises(ValueError, match=needle):
        named_models(models)


def test_file_safe_keeps_names_usable_in_file_names() -> None:
    assert file_safe("hf:facebook/dinov2-small") == "hf_facebook_dinov2-small" and file_safe("a") == "a"
