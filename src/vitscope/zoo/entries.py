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
    return out
