"""The zoo's model names, registered into the model registry through the ``vitscope.models`` entry point."""

from __future__ import annotations

from vitscope.models.entry import ModelEntry

__all__ = ["zoo_entries"]


def zoo_entries() -> list[ModelEntry]:
    """The trained tiny zoo (weights shipped in the package) and its shipped training checkpoints."""
    from vitscope.zoo.catalog import ZOO
    from vitscope.zoo.store import is_built, load_zoo_model

    out = []
    for e in ZOO:
        m = e.model
        vit = e.arch == "tiny-vit"
        widths = tuple(m.get("widths", (32, 64, 128, 256)))
        shape = (len(widths), 0, widths[-1], 16, ())  # the tiny ResNet: its stages, last width, stride 16
        if vit:
            shape = (m.get("depth", 6), m.get("num_heads", 4), m.get("embed_dim", 128), m.get("patch_size", 8),
                     ("cls",) + ("reg",) * m.get("num_reg_tokens", 0))
        steps = (0, *e.snapshot_steps) if e.snapshot_steps else ()
        names = [e.name] + [f"{e.name}@step{s}" for s in steps]
        for n in names:
            what = e.description if n == e.name else f"{e.name} after {n.split('@step')[1]} training steps"
            out.append(ModelEntry(n, e.arch, *shape, builder=lambda n=n: load_zoo_model(n), zoo=True,
                                  description=f"zoo: {what}", source="zoo", available=lambda n=n: is_built(n)))
    return out + planted_entries()


def planted_entries() -> list[ModelEntry]:
    """``tiny-vit-planted`` and its clean twin: ``tiny-vit-sup`` with artifacts planted by weight edits
    (docs/artifacts.md)."""
    from vitscope.zoo.planted import PLANTED_NAMES, planted_model
    from vitscope.zoo.store import is_built

    return [ModelEntry(name, "tiny-vit", 6, 4, 128, 8, ("cls",),
                       builder=lambda t=tagged, n=name: planted_model(t, name=n),
                       description="tiny-vit-sup with artifacts planted by weight edits" if tagged else
                       "tiny-vit-planted's clean twin (every edit but the tag)", source="built-in",
                       available=lambda: is_built("tiny-vit-sup"))
            for name, tagged in PLANTED_NAMES.items()]
