"""WebDataset shards the tests write: 3 tar files of 6 samples (shard 1 labels with json, the others with cls;
shard 2 holds an undecodable image, sample 13, and a sample without one, sample 16)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image


def sample_image(seed: int) -> bytes:
    """The PNG bytes of sample ``seed``."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (30, 26 + seed % 4, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_shards(root: Path) -> Path:
    """Write ``root/000000.tar`` .. ``000002.tar``; returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    index = 0
    for s in range(3):
        with tarfile.open(root / f"{s:06d}.tar", "w") as tar:
            for j in range(6):
                key = f"class{index % 3}/img{index:04d}"
                image = b"broken" if (s, j) == (2, 1) else sample_image(index)
                if (s, j) != (2, 4):
                    _add(tar, f"{key}.png", image)
                if s == 1:
                    _add(tar, f"{key}.json", json.dumps({"label": index % 3}).encode())
                else:
                    _add(tar, f"{key}.cls", str(index % 3).encode())
                index += 1
    return root
