"""Data: image folders, annotated dataset formats, the synthetic world."""

from vitscope.data.load import FORMATS, detect_format, load_dataset

__all__ = ["FORMATS", "detect_format", "load_dataset"]
