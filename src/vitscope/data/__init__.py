"""Data: the Source protocol, image folders, annotated dataset formats, images in memory, the synthetic world."""

from vitscope.data.load import FORMATS, detect_format, load_dataset
from vitscope.data.open import as_source
from vitscope.data.source import Source

__all__ = ["FORMATS", "Source", "as_source", "detect_format", "load_dataset"]
