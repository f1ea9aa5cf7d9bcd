"""Whether hub models are available offline (huggingface_hub only: cheap to import)."""

from __future__ import annotations


def is_cached(hub_id: str) -> bool:
    """Whether a hub id's config is in the local cache (so it loads offline)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(hub_id, "config.json"), str)
    except Exception:
        return False
