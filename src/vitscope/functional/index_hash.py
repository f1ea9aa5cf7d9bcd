"""A seeded splitmix64 hash of dataset indices: one pseudo-random 64-bit number per image that depends on the
image's index and the seed alone, never on which other images are present (splits and shuffles that are exact
under merging and resuming)."""

from __future__ import annotations

import numpy as np

__all__ = ["index_hash"]


def index_hash(indices: np.ndarray, seed: int = 0) -> np.ndarray:
    """splitmix64 of ``index + (seed + 1) * golden ratio`` for every index.

    Args:
        indices: ``[n]`` dataset indices (non-negative integers).
        seed: any integer, taken modulo 2**64 (``-1`` hashes as ``2**64 - 1``).

    Returns:
        ``[n]`` uint64.
    """
    with np.errstate(over="ignore"):
        z = (np.asarray(indices, dtype=np.uint64) + np.uint64(int(seed) % 2**64) * np.uint64(0x9E3779B97F4A7C15)
             + np.uint64(0x9E3779B97F4A7C15))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))
