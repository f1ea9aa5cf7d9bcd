"""What a model's artifacts do: the outliers and the registers ablated (zero, mean, another image's: the controls side
by side) and the test-time register, each read on the model's output and on a k-NN probe, beside the unedited model.

The artifacts analysis says where the artifacts are (its ``first_block``, ``thresholds``, ``register_neurons``);
:func:`artifact_ablations` then makes one pass per edit. The output change is measured on the data's first
``images`` images: for a classifier, the share of images whose top class stays and the KL divergence of the class
distributions (unedited || edited); for an embedding model, the cosine of the edited embedding to the unedited one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from vitscope.analyses.diagnostics.artifacts import Artifacts
from vitscope.analyses.probes.knn import KnnProbe
from vitscope.data.open import as_source
from vitscope.engine.run import run
from vitscope.errors import VitscopeValueError
from vitscope.functional.ablation import MODES
from vitscope.hooks.edits import EditFn, running_images
from vitscope.interventions.artifacts import ablate_outliers
from vitscope.interventions.edits import ablate_tokens
from vitscope.interventions.reference import reference_means
from vitscope.interventions.registers import test_time_register
from vitscope.models.backbone import Backbone
from vitscope.models.outputs import edited_readout, output_change

__all__ = ["artifact_ablations"]


def _pass(backbone: Backbone, source: Any, edits: Mapping[str, EditFn], batch_size: int,
          threshold: float | None) -> dict[str, float]:
    """Under ``edits``, in one pass: the k-NN accuracy of the last block's features (the probe's defaults), the
    largest share of outliers after any block, of CLS attention going to them in any head and of all queries'
    attention going to them in any head (at the unedited model's ``threshold``), and the largest CLS share a
    register receives; the CLS shares are NaN for a model without a CLS token, the all-query share is not."""
    edit = backbone.intervene(dict(edits)) if edits else contextlib.nullcontext()
    with edit:
        results = run(backbone, source, [KnnProbe(), Artifacts(threshold=threshold)], batch_size=batch_size,
                      progress=False, workers=0)
    knn, art = results["knn_probe"], results["artifacts"]
    if "accuracy" not in knn.tensors:
        raise VitscopeValueError(f"the k-NN probe could not score this data: {knn.meta.get('error')}")
    registers = [i for i, kind in enumerate(backbone.spec.prefix_kinds) if kind == "reg"]
    out = {"knn_accuracy": float(knn["accuracy"][-1]), "outlier_fraction": float(art["outlier_fraction"].max()),
           "cls_to_outliers": float(art["sink_cls_outliers"].max()),
           "attention_to_outliers": float(art["sink_all_outliers"].max())}
    if registers:
        out["cls_to_registers"] = float(art["sink_cls_prefix"][..., registers].sum(dim=-1).max())
    return out


def _outlier_site(found: Mapping[str, Any]) -> tuple[str | None, float | None]:
    """Where the first outliers are (``blocks.0.resid_pre`` for the embedding's, else the first block's output)
    and their threshold, from the artifacts result's meta; ``(None, None)`` when it found none."""
    first, thresholds = found.get("first_block"), found.get("thresholds") or []
    if first == "embedding" and thresholds:
        return "blocks.0.resid_pre", thresholds[0]
    if isinstance(first, int):
        return f"blocks.{first}.resid_post", thresholds[list(found["blocks"]).index(first) + 1]
    return None, None


def recorded_images(backbone: Backbone, source: Any, hooks: str | Sequence[str], images: int) -> dict[str, Any]:
    """``{hook: [R, ...]}`` recorded on the data's first ``images`` images, on the CPU (resampling's reference)."""
    import torch

    names = [hooks] if isinstance(hooks, str) else list(hooks)
    pixels = backbone.preprocess(source.first_images(images))
    if len(pixels) < 2:
        raise VitscopeValueError("resampling takes another image's tokens: it needs two reference images or more")
    with torch.no_grad(), backbone.record(names) as rec:
        backbone(pixels.to(backbone.device))
        return {name: rec[name].detach().cpu() for name in names}


def artifact_ablations(backbone: Backbone, data: Any, found: Mapping[str, Any], controls: Sequence[str] = MODES,
                       images: int = 32, reference_images: int = 16, batch_size: int = 16,
                       neurons: Mapping[int, Sequence[int]] | None = None,
                       not_run: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every ablation of the artifacts ``found`` (the artifacts analysis's meta), with its controls, and the
    test-time register, beside the unedited model.

    Args:
        backbone: the model; data: labelled images (k-NN); found: the artifacts result's ``meta``.
        controls: the ablation modes (``zero``, ``mean``, ``resample``).
        images: images the output change is measured on; reference_images: the mean's reference set (the
            data's first images).
        batch_size: of the passes.
        neurons: block -> register neurons for the test-time register (default: the first of
            ``found["register_neurons"]``; none: no test-time register).
        not_run: filled with the edits not run, name -> reason (``outlier_ablations``: no outliers found;
            ``test_time_register``: no register neuron to move when ``found`` ranks none and ``neurons`` is not
            given, or a model that takes no test-time register:
            :func:`~vitscope.interventions.with_test_time_register`).

    Returns:
        One row per edit: ``target`` (``none``, ``outliers``, ``registers``, ``test_time_register``), ``control``,
        ``knn_accuracy`` and ``knn_change`` (from the unedited model), what remains of the artifacts
        (``outlier_fraction``, ``cls_to_outliers`` and ``attention_to_outliers``, the mean share over all queries:
        the largest over blocks and heads, at the unedited model's threshold; ``cls_to_outliers`` is NaN without a
        CLS token; ``cls_to_registers`` when the model has registers) and the output
        change (``top1_kept`` and ``output_kl``, or ``output_cosine``).
    """
    source = as_source(data)
    pixels = backbone.preprocess(source.first_images(images))
    clean_out = edited_readout(backbone, pixels, {})
    first = found.get("first_block")
    hook, threshold = _outlier_site(found)
    base = _pass(backbone, source, {}, batch_size, threshold)
    rows = [{"target": "none", "control": "none", **base, "knn_change": 0.0,
             **output_change(backbone, clean_out, clean_out)}]

    def add(target: str, control: str, edits: Mapping[str, EditFn], model: Backbone = backbone) -> None:
        measured = _pass(model, source, edits, batch_size, threshold)
        with running_images(range(len(pixels))):  # the data's first images: resampled as in the pass
            edited = edited_readout(model, pixels, edits)
        rows.append({"target": target, "control": control, **measured,
                     "knn_change": measured["knn_accuracy"] - base["knn_accuracy"],
                     **output_change(backbone, clean_out, edited)})

    def reference(hooks: str | list[str], mode: str) -> dict[str, Any] | None:
        """The mean's reference set (its mean per position), or resampling's (its images: image ``i`` of a pass
        takes reference image ``(i + 1) mod R``, whatever the batch)."""
        if mode == "mean":
            return reference_means(backbone, source, hooks, batch_size=batch_size, limit=reference_images)
        if mode == "resample":
            return recorded_images(backbone, source, hooks, reference_images)
        return None

    p = backbone.spec.num_prefix_tokens
    if hook is not None and threshold is not None:
        for mode in controls:
            add("outliers", mode, ablate_outliers(hook, threshold, p, mode, reference=reference(hook, mode)))
    elif controls and not_run is not None:
        not_run["outlier_ablations"] = "no outlier tokens were found, so there are none to ablate"
    registers = [i for i, kind in enumerate(backbone.spec.prefix_kinds) if kind == "reg"]
    if registers:
        hooks = [f"blocks.{i}.resid_pre" for i in range(backbone.spec.num_blocks)]
        for mode in controls:
            add("registers", mode, ablate_tokens(registers, mode, hooks=hooks, reference=reference(hooks, mode)))
    ranked = found.get("register_neurons") or []
    chosen = neurons if neurons is not None else ({ranked[0]["block"]: [ranked[0]["unit"]]} if ranked else None)
    if chosen is None and not_run is not None:  # the register is announced with the ablations: say why it is absent
        not_run["test_time_register"] = (
            "no outlier tokens were found, so there is no register neuron to move into a test-time register"
            if first is None else "the artifacts analysis ranked no register neuron, so there is none to move into "
                                  "a test-time register")
    if chosen:
        try:
            registered, edits = test_time_register(backbone, chosen)
        except VitscopeValueError as err:  # BEiT's relative position bias, a pooling head sized for its tokens
            if not_run is not None:
                not_run["test_time_register"] = str(err)
            return rows
        add("test_time_register", "register neurons " + ", ".join(
            f"{b}:{sorted(u)}" for b, u in sorted(chosen.items())), edits, registered)
    return rows
