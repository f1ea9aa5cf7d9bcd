"""Per-block features extracted once and cached on disk (memory-mapped), for every probe and analysis."""

from vitscope.features.cache import CacheEntry, FeatureCache, default_cache_root
from vitscope.features.extract import POOLINGS, FeatureRequest, extract_features
from vitscope.features.rowstore import RowStore
from vitscope.features.views import FrameView, LetterboxView, LongSideView, StandardView, TiledView, View

__all__ = [
    "POOLINGS", "CacheEntry", "FeatureCache", "FeatureRequest", "FrameView",
    "LetterboxView", "LongSideView", "RowStore", "StandardView", "TiledView", "View",
    "default_cache_root", "extract_features",
]
