"""The tiny model zoo: small ViTs (and a ResNet) trained on the synthetic world, shipped as fp16 weights.

``vitscope.load_model("tiny-vit-sup")`` loads one offline; ``vitscope zoo list`` shows every model with
its recipe and held-out score; ``vitscope zoo build NAME`` retrains one from its recipe. ``planted_pair`` gives a
zoo ViT with artifacts planted by weight edits and its clean twin (docs/artifacts.md).
"""

from vitscope.zoo.catalog import ZOO, ZooEntry, get_entry
from vitscope.zoo.planted import PlantedArtifacts, plant_artifacts, planted_pair
from vitscope.zoo.store import is_built, load_zoo_model, zoo_dir

__all__ = ["ZOO", "PlantedArtifacts", "ZooEntry", "checkpoints", "get_entry", "is_built", "load_zoo_model",
           "plant_artifacts", "planted_pair", "zoo_dir"]


def checkpoints(name: str) -> list[str]:
    """Names of ``name``'s training checkpoints, from the initial weights (``@step0``) to the final model."""
    entry = get_entry(name)
    return [f"{name}@step{s}" for s in (0, *entry.snapshot_steps)] + [name]
