"""ViT (and DINO v1, whose checkpoints are ``ViTModel``): CLS token, classifier on the CLS token."""

from vitscope.models.entry import ModelEntry
from vitscope.models.families._common import DINO, INCEPTION
from vitscope.models.family import HFFamily, register_family

FAMILY = register_family(HFFamily(
    name="vit",
    preprocessing={"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "interpolation": "bilinear"},
    aliases=(
        ModelEntry("dino-vits16", "vit", 12, 6, 384, 16, ("cls",), "facebook/dino-vits16", DINO),
        ModelEntry("dino-vits8", "vit", 12, 6, 384, 8, ("cls",), "facebook/dino-vits8", DINO),
        ModelEntry("dino-vitb16", "vit", 12, 12, 768, 16, ("cls",), "facebook/dino-vitb16", DINO),
        ModelEntry("dino-vitb8", "vit", 12, 12, 768, 8, ("cls",), "facebook/dino-vitb8", DINO),
        ModelEntry("vit-b16-in21k", "vit", 12, 12, 768, 16, ("cls",), "google/vit-base-patch16-224-in21k",
                   INCEPTION),
        ModelEntry("vit-b16", "vit", 12, 12, 768, 16, ("cls",), "google/vit-base-patch16-224", INCEPTION),
    ),
))
