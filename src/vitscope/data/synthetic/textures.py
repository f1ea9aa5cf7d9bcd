"""Background textures and instance appearances of the synthetic world.

Backgrounds are muted two-colour textures of a few recognisable *types* (stripes, checker, blobs,
gradient, dots, waves, grid, grain); colours, frequencies, orientations and phases are drawn per scene,
with spatial frequencies relative to the image size so a type looks the same at 64 and 224 px.

Instance appearances (saturated part colours plus a pattern evaluated in the object's canonical frame,
so the texture turns and scales with the object) depend only on ``(class_id, k)``, never on the world's
seed: an instance looks the same in every world built with the same number of classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

_GOLDEN = 0.6180339887498949


def hsv_to_rgb(h: np.ndarray, s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Vectorised HSV (all in [0, 1]) to RGB in [0, 255]; output shape ``h.shape + (3,)`` float32."""
    h, s, v = np.broadcast_arrays(np.asarray(h, np.float64) % 1.0, np.asarray(s, np.float64), np.asarray(v))
    i = np.floor(h * 6.0).astype(int) % 6
    f = h * 6.0 - np.floor(h * 6.0)
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    table = np.stack([np.stack(c, -1) for c in ((v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q))])
    rgb = np.take_along_axis(table, i[None, ..., None], axis=0)[0]
    return (rgb * 255.0).astype(np.float32)


def _muted_colours(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Two background colours: low saturation, clearly different brightness."""
    h = rng.uniform(0, 1)
    h2 = h + rng.uniform(-0.25, 0.25)
    s = rng.uniform(0.1, 0.5, size=2)
    v1 = rng.uniform(0.3, 0.65)
    v2 = np.clip(v1 + rng.choice([-1, 1]) * rng.uniform(0.2, 0.35), 0.15, 0.95)
    return hsv_to_rgb(h, s[0], v1), hsv_to_rgb(h2, s[1], v2)


def _coords(size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Pixel-centre coordinates in units of the image size, rotated by a random angle: ``[H, W]`` each."""
    t = (np.arange(size, dtype=np.float32) + 0.5) / size
    theta = rng.uniform(0, np.pi)
    c, s = np.cos(theta), np.sin(theta)
    x, y = t[None, :], t[:, None]
    return c * x + s * y, c * y - s * x


def _stripes(size: int, rng: np.random.Generator) -> np.ndarray:
    a, _ = _coords(size, rng)
    freq = rng.uniform(4, 9)
    return (np.sin(2 * np.pi * freq * a + rng.uniform(0, 2 * np.pi)) > 0).astype(np.float32)


def _checker(size: int, rng: np.random.Generator) -> np.ndarray:
    a, b = _coords(size, rng)
    n = rng.uniform(3, 7)
    return ((np.floor(a * n + rng.uniform(0, 1)) + np.floor(b * n + rng.uniform(0, 1))) % 2).astype(np.float32)


def smooth_noise(size: int, rng: np.random.Generator, cells: int) -> np.ndarray:
    """``[size, size]`` float32 in [0, 1]: a random ``cells x cells`` grid upsampled bilinearly."""
    grid = rng.uniform(0, 1, size=(cells + 1, cells + 1)).astype(np.float32)
    t = (np.arange(size, dtype=np.float32) + 0.5) / size * cells
    i = np.minimum(t.astype(int), cells - 1)
    f = t - i
    rows = grid[i] * (1 - f)[:, None] + grid[i + 1] * f[:, None]
    return rows[:, i] * (1 - f)[None, :] + rows[:, i + 1] * f[None, :]


def _blobs(size: int, rng: np.random.Generator) -> np.ndarray:
    n = smooth_noise(size, rng, int(rng.integers(3, 6)))
    return np.clip((n - np.median(n)) * 5.0 + 0.5, 0.0, 1.0)


def _gradient(size: int, rng: np.random.Generator) -> np.ndarray:
    a, _ = _coords(size, rng)
    a = (a - a.min()) / max(float(a.max() - a.min()), 1e-6)
    return a ** rng.uniform(0.6, 1.6)


def _dots(size: int, rng: np.random.Generator) -> np.ndarray:
    a, b = _coords(size, rng)
    n = rng.uniform(4, 8)
    fa, fb = (a * n + rng.uniform(0, 1)) % 1.0 - 0.5, (b * n + rng.uniform(0, 1)) % 1.0 - 0.5
    return (fa**2 + fb**2 < rng.uniform(0.05, 0.1)).astype(np.float32)


def _waves(size: int, rng: np.random.Generator) -> np.ndarray:
    a, b = _coords(size, rng)
    warp = 0.06 * np.sin(2 * np.pi * rng.uniform(1.5, 3) * b + rng.uniform(0, 2 * np.pi))
    return (np.sin(2 * np.pi * rng.uniform(3, 6) * (a + warp)) > 0).astype(np.float32)


def _grid(size: int, rng: np.random.Generator) -> np.ndarray:
    a, b = _coords(size, rng)
    n = rng.uniform(3, 6)
    width = rng.uniform(0.08, 0.16)
    return ((((a * n) % 1.0) < width) | (((b * n) % 1.0) < width)).astype(np.float32)


def _grain(size: int, rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(0, 1, size=(size, size)).astype(np.float32)


BACKGROUNDS: dict[str, Callable[[int, np.random.Generator], np.ndarray]] = {
    "stripes": _stripes,
    "checker": _checker,
    "blobs": _blobs,
    "gradient": _gradient,
    "dots": _dots,
    "waves": _waves,
    "grid": _grid,
    "grain": _grain,
}
BACKGROUND_NAMES: tuple[str, ...] = tuple(BACKGROUNDS)


def background_image(kind: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``[size, size, 3]`` uint8 background of type ``BACKGROUND_NAMES[kind]`` with random parameters."""
    c1, c2 = _muted_colours(rng)
    w = BACKGROUNDS[BACKGROUND_NAMES[kind]](size, rng)[..., None]
    return (c1 * (1.0 - w) + c2 * w).astype(np.uint8)


PATTERNS = ("solid", "stripes", "dots", "checker", "rings")


@dataclass(frozen=True)
class Appearance:
    """How one instance looks.

    Attributes:
        colours: ``[P, 2, 3]`` float32 primary and secondary RGB colour of each part.
        pattern: one of :data:`PATTERNS`; chooses the secondary colour where the pattern is on.
        freq: pattern frequency in cycles per canonical unit (the object's radius).
        angle: pattern orientation, radians.
        phase: pattern phase.
    """

    colours: np.ndarray
    pattern: str
    freq: float
    angle: float
    phase: float


def instance_appearance(class_id: int, k: int, num_parts: int, main_part: int) -> Appearance:
    """Deterministic appearance of instance ``k`` of class ``class_id`` (independent of any world seed).

    The main (largest) part takes a hue near the class hue; the other parts take free hues. The
    secondary colour of a part is a darker or lighter shade of its primary.
    """
    rng = np.random.default_rng([104729, class_id, k])
    class_hue = (class_id * _GOLDEN) % 1.0
    hues = rng.uniform(0, 1, size=num_parts)
    hues[main_part] = class_hue + rng.uniform(-0.06, 0.06)
    sat = rng.uniform(0.55, 1.0, size=num_parts)
    val = rng.uniform(0.55, 1.0, size=num_parts)
    shift = rng.choice([-1.0, 1.0], size=num_parts) * rng.uniform(0.3, 0.45, size=num_parts)
    val2 = np.clip(val + shift, 0.1, 1.0)
    val2 = np.where(np.abs(val2 - val) < 0.2, val - 0.4, val2)
    colours = np.stack([hsv_to_rgb(hues, sat, val), hsv_to_rgb(hues, sat * 0.9, val2)], axis=1)
    pattern = PATTERNS[int(rng.integers(len(PATTERNS)))]
    return Appearance(
        colours=colours.astype(np.float32),
        pattern=pattern,
        freq=float(rng.uniform(2.0, 4.0)),
        angle=float(rng.uniform(0, np.pi)),
        phase=float(rng.uniform(0, 1)),
    )


def pattern_mask(app: Appearance, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Where the instance's pattern is on, at canonical coordinates ``u``, ``v`` (same shape, bool)."""
    if app.pattern == "solid":
        return np.zeros(u.shape, dtype=bool)
    c, s = np.cos(app.angle), np.sin(app.angle)
    a = (c * u + s * v) * app.freq + app.phase
    if app.pattern == "stripes":
        return (a % 1.0) < 0.5
    b = (c * v - s * u) * app.freq + app.phase
    if app.pattern == "dots":
        return ((a % 1.0) - 0.5) ** 2 + ((b % 1.0) - 0.5) ** 2 < 0.09
    if app.pattern == "checker":
        return ((np.floor(a) + np.floor(b)) % 2) == 1
    return ((np.hypot(u, v) * app.freq * 1.5 + app.phase) % 1.0) < 0.5


def paint(app: Appearance, parts: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``[n, 3]`` uint8 colours of ``n`` object pixels given their part indices and canonical coordinates."""
    on = pattern_mask(app, u, v).astype(np.intp)
    return app.colours[parts, on].astype(np.uint8)
