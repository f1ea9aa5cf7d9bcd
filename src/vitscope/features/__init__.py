"""The feature cache: per-block features kept on disk (memory-mapped), the views images are seen through, row stores.

:func:`vitscope.engine.extract.extract_features` fills it from one pass of the engine.
"""

from vitscope.features.cache import CacheEntry, FeatureCache, default_cache_root
from vitscope.features.request import POOLINGS, FeatureRequest
from vitscope.features.rowstore import RowStore
from vitscope.features.views import FrameView, LetterboxView, LongSideView, StandardView, TiledView, View

__all__ = [
    "POOLINGS", "CacheEntry", "FeatureCache", "FeatureRequest", "FrameView",
    "LetterboxView", "LongSideView", "RowStore", "StandardView", "TiledView", "View",
    "default_cache_root",
]
