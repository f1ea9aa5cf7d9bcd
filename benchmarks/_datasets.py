"""Lazy, deterministic synthetic image dataset shared by the benchmark scripts.

``SyntheticImages(n, size)`` is a ``vitscope.data.Source`` (``len``, ``load(i)``).
Nothing is stored per image: ``load(i)`` builds image ``i``
from its index every time (a smooth gradient plus index-seeded noise), so the dataset's own
memory does not grow with ``n`` and two calls with the same index return identical pixels.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image

# Let ``python benchmarks/<script>.py`` import vitscope from a src-layout checkout even when the
# package is not installed into the interpreter that runs the script.
_SRC = Path(__file__).resolve().parent.parent / "src"
if _SRC.is_dir() and str(_SRC) not in sys.path:
    sys.path.insert(0, str(_SRC))

from vitscope.data.source import Source  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def synthetic_image(index: int, size: int = 224, seed: int = 0) -> Image.Image:
    """Deterministic RGB image ``size x size`` for ``index``: a per-index colour ramp plus noise."""
    rng = np.random.default_rng((seed, index))
    ramp = np.linspace(0.0, 1.0, size, dtype=np.float32)
    base = rng.uniform(0.0, 1.0, size=3).astype(np.float32)
    img = np.empty((size, size, 3), dtype=np.float32)
    img[..., 0] = base[0] * ramp[None, :]
    img[..., 1] = base[1] * ramp[:, None]
    img[..., 2] = base[2]
    img += rng.normal(0.0, 0.15, size=img.shape).astype(np.float32)
    return Image.fromarray((np.clip(img, 0.0, 1.0) * 255).astype(np.uint8), mode="RGB")


class SyntheticImages(Source):
    """``n`` synthetic RGB images generated lazily from their index (nothing cached), a vitscope Source.

    Args:
        n: number of images.
        size: side length in pixels (images are square; the backbone's preprocessing resizes them).
        seed: changes every image.
    """

    def __init__(self, n: int, size: int = 224, seed: int = 0) -> None:
        if n < 0:
            raise ValueError("n must be >= 0")
        super().__init__()
        self.n, self.size, self.seed = int(n), int(size), int(seed)
        self.paths = [f"synthetic:{i}" for i in range(self.n)]
        self.name = f"synthetic-{self.n}"

    def load(self, i: int) -> Image.Image:
        return synthetic_image(i, self.size, self.seed)

    def content_digest(self) -> str:
        return f"synthetic-{self.n}-{self.size}-{self.seed}"


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else ``platform.processor()``."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
