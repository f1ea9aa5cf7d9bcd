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
