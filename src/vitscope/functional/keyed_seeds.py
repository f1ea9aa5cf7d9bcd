"""Random generators keyed by what a draw is for (a seed, a hook, an image...), so that one image's draws do not
depend on which other images share its batch or how many draws came before."""

from __future__ import annotations

import hashlib

import torch

__all__ = ["keyed_generator"]


def keyed_generator(*key: object) -> torch.Generator:
    """A CPU generator seeded by the parts of ``key`` joined by ``:`` (hashed: neighbouring keys give unrelated
    streams).

    Args:
        key: e.g. ``(seed, hook, image index)``.
    """
    digest = hashlib.blake2b(":".join(str(part) for part in key).encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") & (2 ** 63 - 1))
