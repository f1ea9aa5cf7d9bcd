"""What a run's memory needs: a warning when a batch's attention patterns will not fit in the free memory.

The engine does not change the process's allocator: with one block's pattern alive at a time
(engine/streaming.py) peak memory stays flat in the number of images under glibc's own settings
(benchmarks/streaming_memory.py: 512 vs 64 images within 5%), and a fixed 1 MiB mmap threshold, used before,
made every large buffer be page-faulted in anew and the bare forward itself slower.
"""

from __future__ import annotations


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
