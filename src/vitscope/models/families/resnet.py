"""ResNet (CNN, for comparison): stages and the pooled features; classifier as the checkpoint's."""

from vitscope.models.entry import ModelEntry
from vitscope.models.families._common import DINO
from vitscope.models.family import HFFamily, register_family

FAMILY = register_family(HFFamily(
    name="resnet",
    kind="cnn",
    aliases=(ModelEntry("resnet50", "resnet", 4, 0, 2048, 32, (), "microsoft/resnet-50",
                        {**DINO, "interpolation": "bilinear"}),),
))
