"""Token grids as analyses name them: images of one run may have several (each keeps its aspect ratio), and an
analysis whose state depends on the grid keeps one per grid, named ``"HxW"``; its results show the grid of most
images under the plain names and the others with ``@HxW`` appended."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

__all__ = ["by_images", "grid_counts", "grid_key", "grid_of"]


def grid_key(grid: Sequence[int]) -> str:
    """``(h, w)`` -> ``"HxW"``."""
    return f"{int(grid[0])}x{int(grid[1])}"


def grid_of(key: str) -> tuple[int, int]:
    """``"HxW"`` -> ``(h, w)``."""
    h, w = key.split("x")
    return int(h), int(w)


def by_images(counts: Iterable[tuple[str, float]]) -> list[tuple[str, float]]:
    """``(grid key, images)`` pairs, most images first, ties by the smaller grid: the first is the run's main grid."""
    return sorted(((k, n) for k, n in counts if n), key=lambda kn: (-kn[1], grid_of(kn[0])))


def grid_counts(grids: Mapping[tuple[int, int], int]) -> dict[str, int]:
    """``{(h, w): images}`` -> ``{"HxW": images}``, in :func:`by_images` order (what results.json lists)."""
    return {key: int(n) for key, n in by_images((grid_key(g), n) for g, n in grids.items())}
