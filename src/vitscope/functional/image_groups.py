"""How many images of a batch to work through at a time when one image's tensor is large.

The recording kernel, the block statistics and interrelation each hold a few ``[b, H, N, N]`` temporaries at
once; at 1,370 tokens one image's pattern is 45 MB, a batch of 16 is 720 MB. Working through ``b`` images at
a time keeps those temporaries near :data:`GROUP_BYTES` whatever the batch size.
"""

from __future__ import annotations

__all__ = ["GROUP_BYTES", "images_per_group"]

#: bytes of one tensor per group of images
GROUP_BYTES = 192 << 20


def images_per_group(per_image_bytes: int) -> int:
    """Images per group so that a tensor of ``per_image_bytes`` per image stays near :data:`GROUP_BYTES`
    (at least one)."""
    return max(1, GROUP_BYTES // max(1, int(per_image_bytes)))
