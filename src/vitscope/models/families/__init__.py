"""One descriptor file per Hugging Face family (:class:`vitscope.models.family.HFFamily`); importing this
package registers them all."""

from vitscope.models.families import (
           beit,
           bit,
           clip,
           convnext,
           deit,
           dinov2,
           dinov2_with_registers,
           resnet,
           siglip,
           vit,
           vit_mae,
)

__all__ = ["beit", "bit", "clip", "convnext", "deit", "dinov2", "dinov2_with_registers", "resnet", "siglip", "vit",
           "vit_mae"]
