"""Keep a streaming run's memory flat in the number of images under glibc's allocator.

Every batch allocates and frees tens to hundreds of MB (decoded images in the loader thread, one
``[B, H, N, N]`` float32 pattern per block). glibc raises its mmap threshold after such frees and
then serves these blocks from heap arenas that fragment: on a ViT-S run (batch 8, 224 px) peak
resident memory for 512 images was 11-18% above the peak for 64 before levelling off. A fixed
1 MiB threshold sends every large block back to the OS when freed, and the peak stays within 2%
(benchmarks/streaming_memory.py). The price is that large buffers are page-faulted in anew each
batch; benchmarks/README.md gives the measured cost. Tried and rejected: trimming the heap every
few batches, and a single malloc arena (neither kept the peak within 10% reliably).
Set ``VITSCOPE_KEEP_MALLOC=1`` to leave the allocator as it is.
"""

from __future__ import annotations

import ctypes
import os
import sys
from functools import cache

M_MMAP_THRESHOLD = -3  # glibc <malloc.h>


@cache
def limit_fragmentation(threshold: int = 1 << 20) -> bool:
    """Serve allocations of at least ``threshold`` bytes with mmap (once per process; glibc only).

    Returns:
        True when the setting is in force.
    """
    if os.environ.get("VITSCOPE_KEEP_MALLOC") or not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):  # musl or another libc: nothing to tune
        return False


class MemoryWarning(UserWarning):
    """A run's attention patterns are unlikely to fit in the memory that is free."""


def available_bytes(device: str = "cpu") -> int | None:
    """Memory free for this run: CUDA's free memory on a GPU, ``MemAvailable`` on Linux (None when unknown)."""
    if str(device).startswith("cuda"):
        import torch

        try:
            return int(torch.cuda.mem_get_info(torch.device(device))[0])
        except (RuntimeError, AssertionError):
            return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def pattern_fit(num_heads: int, num_tokens: int, batch_size: int, kept_blocks: int, free: int | None
                ) -> str | None:
    """A one-line warning when a batch's attention patterns will not fit in ``free`` bytes, with the batch size
    that does (None when they fit or nothing is known).

    The engine holds one block's pattern ``[B, H, N, N]`` float32 at a time plus about as much work memory,
    and every pattern an analysis reads whole (``kept_blocks``) until the batch is done.
    """
    if free is None or num_heads < 1:
        return None
    per_image = num_heads * num_tokens * num_tokens * 4 * (2 + kept_blocks)
    if per_image * batch_size <= free:
        return None
    fits = free // per_image
    gb = per_image * batch_size / 2**30
    if fits < 1:
        return (f"one image's attention patterns ({per_image / 2**30:.1f} GB at {num_tokens} tokens, {num_heads} "
                f"heads) need more than the {free / 2**30:.1f} GB free; use a smaller input size or fewer analyses "
                "that read patterns whole")
    return (f"a batch of {batch_size} needs about {gb:.1f} GB for attention patterns ({num_tokens} tokens, "
            f"{num_heads} heads), more than the {free / 2**30:.1f} GB free; use -b {int(fits)} "
            f"(batch_size={int(fits)})")
