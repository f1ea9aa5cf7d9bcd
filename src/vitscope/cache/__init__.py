"""What a run keeps on disk: the feature cache (per-block features, memory-mapped, reused across runs) and the
disk-backed row stores analyses spill their rows to.

:func:`vitscope.engine.extract.extract_features` fills the feature cache from one pass of the engine; the views
images are seen through for it are in :mod:`vitscope.models.views`.
"""

from vitscope.cache.feature_cache import CacheEntry, FeatureCache, default_cache_root
from vitscope.cache.request import POOLINGS, FeatureRequest
from vitscope.cache.rowstore import RowStore

__all__ = ["POOLINGS", "CacheEntry", "FeatureCache", "FeatureRequest", "RowStore", "default_cache_root"]
