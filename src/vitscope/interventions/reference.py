"""The reference of a mean ablation: every named tensor's mean over a set of images, in one streaming pass."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vitscope.analyses.activations.hook_tensors import HookMeans
from vitscope.engine.run import run
from vitscope.engine.settings import resolve_device
from vitscope.errors import VitscopeValueError
from vitscope.models.backbone import Backbone

__all__ = ["reference_means"]


def reference_means(backbone: Backbone, data: Any, hooks: Sequence[str] | str, batch_size: int = 16,
                    limit: int | None = None, device: str | torch.device | None = None) -> dict[str, torch.Tensor]:
    """``{name: mean over the images of data}`` of every hook ``hooks`` names, each one image's shape (e.g.
    ``blocks.3.attn.heads`` -> ``[H, N, Dh]``), on the CPU.

    Args:
        backbone: the model.
        data: anything :func:`vitscope.run` reads (a folder, ``ROOT::FORMAT``, a Source...) or a tensor
            ``[R, 3, H, W]`` of preprocessed pixels.
        hooks: canonical names or glob patterns.
        batch_size, limit, device: as for :func:`vitscope.run` (for a tensor too: its first ``limit`` images, the
            model moved to ``device``).
    """
    if isinstance(data, torch.Tensor):
        if limit is not None and (isinstance(limit, bool) or int(limit) != limit or limit < 1):
            raise VitscopeValueError(f"limit must be a whole number of images, at least 1 (or None: every image), "
                                     f"got {limit!r}")
        data = data if limit is None else data[:int(limit)]
        backbone.to(resolve_device(device)).eval()
        means = HookMeans(hooks)
        with torch.no_grad(), backbone.record(means.required_hooks(backbone.spec)) as rec:
            for i in range(0, len(data), batch_size):
                backbone(data[i:i + batch_size].to(backbone.device))
                means.update(rec, _PixelsBatch(len(data[i:i + batch_size])))
        computed = means.compute()
    else:
        computed = run(backbone, data, [HookMeans(hooks)], batch_size=batch_size, limit=limit, device=device,
                       progress=False)["hook_means"]
    return {k: v.cpu() for k, v in computed.tensors.items()}


class _PixelsBatch:
    """What :meth:`HookMeans.update` reads of a batch of given pixels: its size."""

    def __init__(self, size: int) -> None:
        self.size = size
