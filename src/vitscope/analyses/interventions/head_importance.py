"""How much the model's output needs each head: every head of every block ablated, with every control beside the
others (zero, mean over a reference set, another image's output), in the one pass."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

import torch

from vitscope.analyses.base import Analysis, Batch, Figure, Result
from vitscope.analyses.registry import register_analysis
from vitscope.analyses.state import added
from vitscope.errors import VitscopeRuntimeError, VitscopeValueError
from vitscope.functional.ablation import MODES, replaced
from vitscope.models.outputs import readout
from vitscope.models.spec import ModelSpec

__all__ = ["HeadImportance", "HeadImportanceResult"]

HEADS = "blocks.*.attn.heads"
RESIDUALS = "blocks.*.resid_pre"
#: an embedding model's output (its effect is ``1 - cosine``: the unedited embedding scores 1)
COSINE = "cosine to the unedited embedding"


def _effect_label(output: str) -> str:
    """What a cell of the maps holds, given the output it is the drop of: ``1 - cosine ...`` for an embedding
    model, else ``drop of the <output>`` (the maps hold ``clean - ablated``, never the output itself)."""
    return f"1 - {output}" if output == COSINE else f"drop of the {output}"


class HeadImportanceResult(Result):
    """Result of :class:`HeadImportance`: one blocks x heads map per control."""

    DIMS = {"*": ("block", "head")}

    def figures(self) -> list[Figure]:
        """``<name>_<control>``: the effect of ablating each head, blocks x heads, one heat map per control."""
        unit, n = self.meta.get("output", ""), self.meta.get("num_images", 0)
        effect = _effect_label(unit)
        figures = []
        for control in self.meta.get("controls", []):
            if control not in self.tensors:
                continue
            caption = (f"The drop of the model's output ({unit}) when one head's output is replaced ({control} "
                       f"control: {CONTROL_TEXT[control]}); read every control beside the others: zeroing alone "
                       "overstates what a head does.")
            title = f"Head ablation ({control}): {effect}, {n} images"
            figures.append(self.heatmap_figure(
                f"_{control}", self.tensors[control], title, effect, caption,
                "head ablation (Michel et al. 2019); controls after Heimersheim and Nanda 2024",
                block_labels=self.meta.get("blocks")))
        return figures


CONTROL_TEXT = {"zero": "set to zero", "mean": "set to its mean over the reference images",
                "resample": "taken from another image (a reference image)"}


@register_analysis("head_importance", groups=("interventions",), default=False, order=210)
class HeadImportance(Analysis):
    """The change of the model's output when each head is ablated, for every control side by side.

    For every block ``i`` and head ``h``, the block's input (``resid_pre``, recorded) runs through blocks ``i`` on
    with head ``h``'s output (``blocks.{i}.attn.heads``) replaced, then the final norm and the readout: one
    batched forward of the remaining blocks per (block, head, control). The output is, for a classifier, the logit
    of the image's label (of its predicted class when the image has no label: decided image by image, so no number
    depends on the batch) and the effect its drop; for an embedding model (no head), the pooled token's cosine to
    the unedited one and the effect ``1 - cosine``. Controls:
    ``zero``; ``mean``: the head's mean output per token over the reference images (the first
    ``reference_images`` of the data); ``resample``: the head's output on a reference image, image ``j`` taking
    reference ``(j + 1) mod R`` (never itself), so no number depends on the batch.

    Args:
        controls: which of ``zero``, ``mean``, ``resample``.
        reference_images: the reference set's size (its first images of the data).
        blocks: the blocks whose heads are ablated (default all).

    State: ``num_images``, the images scored by their label (``labelled``) and by their prediction
    (``predicted``), and ``effect`` sums ``[L, H]`` per control (float64).
    """

    description = ("Head importance: every head ablated in turn, with the zero, mean and resample controls side by "
                   "side, and the drop of the model's output (the label's logit, or the embedding's cosine).")
    summary = "output change when each head is ablated (3 controls)"
    needs_transformer: ClassVar[bool] = True
    reruns_model: ClassVar[bool] = True

    def __init__(self, controls: Sequence[str] = MODES, reference_images: int = 16,
                 blocks: Sequence[int] | None = None) -> None:
        super().__init__()
        controls = (controls,) if isinstance(controls, str) else tuple(controls)
        bad = [c for c in controls if c not in MODES]
        if bad or not controls:
            raise VitscopeValueError(f"controls must be among {', '.join(MODES)}, got {list(controls)}")
        if int(reference_images) < 2:
            raise VitscopeValueError(f"reference_images must be at least 2, got {reference_images}")
        self._cfg_controls, self._cfg_blocks = controls, None if blocks is None else tuple(int(b) for b in blocks)
        self.reference_images = int(reference_images)
        self._cfg_reference_images = self.reference_images
        self.add_state("num_images", 0, reduce="sum")
        self.add_state("effect", {}, reduce="sum")  # control -> [L, H] float64
        self.add_state("clean", None, reduce="sum")  # sum of the unedited output
        self.add_state("labelled", 0, reduce="sum")  # classifier: images scored by their label's logit
        self.add_state("predicted", 0, reduce="sum")  # ... and by their predicted class's (no label)
        self.add_state("output", "", reduce="same")  # "logit" or the embedding's score

    def why_unsupported(self, spec: ModelSpec) -> str | None:
        if spec.max_tokens:
            return (f"analysis '{self.name}' replaces heads by their mean or another image's output token by token, "
                    "but images keep their aspect ratios here and have token grids of their own")
        return None

    def required_hooks(self, spec: ModelSpec) -> list[str]:
        return [RESIDUALS]

    def record_reads(self, spec: ModelSpec) -> list[str]:
        return [RESIDUALS]

    def reference_hooks(self, spec: ModelSpec) -> list[str]:
        return [HEADS] if {"mean", "resample"} & set(self._cfg_controls) else []

    def set_reference(self, activations: Mapping[str, torch.Tensor]) -> None:
        """The reference set; ``resample`` refuses one of a single image (a run limited to one image), where every
        image would take its own output."""
        held = {len(t) for t in activations.values()}
        if "resample" in self._cfg_controls and held and min(held) < 2:
            raise VitscopeValueError("head_importance's resample control takes another image's head outputs: it needs "
                                     "two reference images or more, and this run has one (a limit of 1?)")
        super().set_reference(activations)

    def _blocks(self, spec: ModelSpec) -> list[int]:
        blocks = list(range(spec.num_blocks)) if self._cfg_blocks is None else list(self._cfg_blocks)
        bad = [b for b in blocks if not 0 <= b < spec.num_blocks]
        if bad:
            raise VitscopeValueError(f"head_importance: blocks {bad} do not exist ({spec.num_blocks} blocks)")
        return blocks

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        if batch.size == 0:
            return
        if batch.model is None:
            raise VitscopeRuntimeError("head_importance runs the model again with heads ablated: run it through "
                                       "vitscope.run, which hands every batch its model")
        spec = batch.spec
        labels = batch.targets.get("label") if batch.targets else None
        # per image, so an unlabelled image changes only its own score, whatever batch it comes in
        known = [v is not None and int(v) >= 0 for v in labels] if labels is not None else [False] * batch.size
        blocks = self._blocks(spec)

        def measure(b, block: int, edit=None) -> torch.Tensor:  # [B]: the output for one ablation
            start = record[f"blocks.{block}.resid_pre"]
            with b.intervene(edit or {}):
                out = readout(b, b.run_blocks(start, block))
            return out

        def score(out: torch.Tensor, clean_out: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
            if spec.classifies:
                return out.gather(1, target[:, None])[:, 0]
            return torch.nn.functional.cosine_similarity(out, clean_out, dim=-1)

        def run(b) -> None:
            clean_out = measure(b, blocks[0])
            target = None
            if spec.classifies:
                given = torch.as_tensor([int(labels[j]) if k else 0 for j, k in enumerate(known)],
                                        device=clean_out.device)
                target = torch.where(torch.as_tensor(known, device=clean_out.device), given, clean_out.argmax(-1))
                self.labelled += sum(known)
                self.predicted += len(known) - sum(known)
            clean = score(clean_out, clean_out, target).double()
            self.output = "logit" if spec.classifies else COSINE
            self.clean = added(self.clean, clean.sum())
            partners = torch.as_tensor([(int(i) + 1) % self.reference_images for i in batch.indices])
            for control in self._cfg_controls:
                rows = []
                for block in blocks:
                    name = f"blocks.{block}.attn.heads"
                    ref = self.reference.get(name)
                    mean = ref.mean(dim=0) if control == "mean" else None
                    other = ref[partners % len(ref)] if control == "resample" else None
                    effects = []
                    for head in range(spec.num_heads):
                        def edit(t, n, _h=head, _mean=mean, _other=other, _control=control):
                            return replaced(t, (slice(None), [_h]), _control, mean=_mean, other=_other)
                        s = score(measure(b, block, {name: edit}), clean_out, target).double()
                        effects.append((clean - s).sum())
                    rows.append(torch.stack(effects))
                self.effect[control] = added(self.effect.get(control), torch.stack(rows))
        batch.model.run(run)
        self.num_images += batch.size

    def compute(self) -> HeadImportanceResult:
        output = self.output
        if output == "logit":
            output = ("logit of the predicted class" if not self.labelled
                      else "logit of the label" if not self.predicted
                      else "logit of the label (of the predicted class for images without one)")
        meta = {"num_images": self.num_images, "controls": list(self._cfg_controls), "output": output,
                "reference_images": self.reference_images,
                "blocks": None if self._cfg_blocks is None else list(self._cfg_blocks)}
        if self.output == "logit":
            meta.update(labelled_images=self.labelled, predicted_images=self.predicted)
        tensors = {}
        if self.num_images:
            tensors = {control: self.effect[control] / self.num_images for control in self._cfg_controls}
            tensors["clean_output"] = torch.as_tensor(self.clean / self.num_images, dtype=torch.float64)
        return HeadImportanceResult(name=self.name, tensors=tensors, meta=meta)
