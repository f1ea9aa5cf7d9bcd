"""ConvNeXt (CNN)."""

from vitscope.models.entry import ModelEntry
from vitscope.models.families._common import DINO
from vitscope.models.family import HFFamily, register_family

FAMILY = register_family(HFFamily(
    name="convnext",
    kind="cnn",
    aliases=(ModelEntry("convnext-tiny", "convnext", 4, 0, 768, 32, (), "facebook/convnext-tiny-224", DINO),),
))
