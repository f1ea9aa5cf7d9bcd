"""BiT (CNN): a ResNet with group norm and weight standardisation."""

from vitscope.models.entry import ModelEntry
from vitscope.models.families._common import INCEPTION
from vitscope.models.family import HFFamily, register_family

FAMILY = register_family(HFFamily(
    name="bit",
    kind="cnn",
    aliases=(ModelEntry("bit-50", "bit", 4, 0, 2048, 32, (), "google/bit-50", {**INCEPTION, "resize_size": 256}),),
))
