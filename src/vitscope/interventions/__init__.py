"""Ready-made interventions for :meth:`vitscope.Backbone.intervene`: each returns the ``{hook: fn}`` mapping it
takes (an :class:`~vitscope.interventions.edits.EditSet`), so they combine with ``|``; where two name the same hook,
the left one's edit runs first and the right one's edits its result::

    from vitscope.interventions import ablate_heads, patch, reference_means

    means = reference_means(backbone, "images/", "blocks.*.attn.heads")
    with backbone.intervene(ablate_heads({3: [0, 5]}, mode="mean", reference=means)):
        logits = backbone(pixels).logits

Every ablation has its controls (``mode``): ``"zero"``, ``"mean"`` (over a reference set) and ``"resample"``
(another image's activations); read an ablation beside them (:mod:`vitscope.functional.ablation`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vitscope._lazy import lazy_exports

__all__ = ["EditSet", "ablate_heads", "ablate_outliers", "ablate_tokens", "patch", "reference_means",
           "register_neuron_edits", "steer", "test_time_register", "with_test_time_register"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "ablate_heads": "vitscope.interventions.edits",
    "ablate_outliers": "vitscope.interventions.artifacts",
    "ablate_tokens": "vitscope.interventions.edits",
    "EditSet": "vitscope.interventions.edits",
    "patch": "vitscope.interventions.edits",
    "reference_means": "vitscope.interventions.reference",
    "register_neuron_edits": "vitscope.interventions.registers",
    "steer": "vitscope.interventions.edits",
    "test_time_register": "vitscope.interventions.registers",
    "with_test_time_register": "vitscope.interventions.registers",
})

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from vitscope.interventions.artifacts import ablate_outliers
    from vitscope.interventions.edits import EditSet, ablate_heads, ablate_tokens, patch, steer
    from vitscope.interventions.reference import reference_means
    from vitscope.interventions.registers import register_neuron_edits, test_time_register, with_test_time_register
