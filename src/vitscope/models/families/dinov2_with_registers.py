"""DINOv2 with registers: CLS, then ``num_register_tokens`` registers; classifier as DINOv2."""

from vitscope.models.entry import ModelEntry
from vitscope.models.families._common import DINO
from vitscope.models.families.dinov2 import cls_and_patch_mean_head
from vitscope.models.family import HFFamily, register_family

FAMILY = register_family(HFFamily(
    name="dinov2_with_registers",
    prefix=lambda config: ("cls",) + ("reg",) * int(config.num_register_tokens),
    head=cls_and_patch_mean_head,
    aliases=(
        ModelEntry("dinov2-vits14-reg", "dinov2_with_registers", 12, 6, 384, 14, ("cls",) + ("reg",) * 4,
                   "facebook/dinov2-with-registers-small", DINO),
    ),
))
