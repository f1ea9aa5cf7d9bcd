"""How one run turns each loaded batch into what its analyses read: the forward (the model's own preprocessing
by input size, or a view's groups) while recording the hooks, and the :class:`~vitscope.analyses.batch.Batch` of
every group, with the run's shared quantities, the model and, under a view, its geometry."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from vitscope.analyses.base import Batch
from vitscope.analyses.batch import ModelRunner, SharedQuantities
from vitscope.engine.batches import LoadedBatch
from vitscope.engine.streaming import StreamPlan, in_block_order
from vitscope.functional.attention_blocks import Workspace
from vitscope.hooks.edits import running_images
from vitscope.models.backbone import Backbone
from vitscope.models.preprocess import normalise_pixels
from vitscope.models.spec import ModelSpec

__all__ = ["BatchForward", "view_frame"]


@dataclass
class BatchForward:
    """What every batch of one run shares: the model, its record, the device, the plan, the work buffers."""

    backbone: Backbone
    record: Any
    device: torch.device
    autocast: Any
    plan: dict[str, frozenset[str]]
    workspace: Workspace
    view: Any
    stream: StreamPlan  # what happens to each hook as the model makes it
    compile_stats: bool = False  # the shared attention statistics through torch.compile
    grids: dict[tuple[int, int], int] = field(default_factory=dict)  # token grid -> images of this process

    def batches(self, loaded: LoadedBatch) -> Iterator[tuple[Mapping[str, torch.Tensor], Batch]]:
        """``(record, batch)`` for every group of ``loaded`` that runs through the model together."""
        spec = self.backbone.spec
        if self.view is None:  # the model's own preprocessing: each input size of the batch at once
            groups = loaded.pixels if isinstance(loaded.pixels, list) else [(range(len(loaded.indices)),
                                                                              loaded.pixels)]
            for positions, pixels in groups:
                pixels = pixels.to(self.device, non_blocking=True)  # pinned when workers load for a GPU
                if pixels.dtype == torch.uint8:  # resized by the loader, normalised here (the same bits)
                    pixels = normalise_pixels(pixels, spec)
                yield self.record, self._forward(pixels, loaded, positions)
            return

        def forward(pixels: torch.Tensor, positions: Sequence[int]) -> dict[str, torch.Tensor]:
            self.record.clear()
            with self.autocast, running_images([loaded.indices[j] for j in positions], _tile_numbers(positions)):
                self.backbone(pixels.to(self.device))
            return dict(self.record)

        for group in self.view.tokens(loaded.images, spec, forward):  # grouped by frame size; tiles stitched
            group_spec = spec if group.num_prefix == spec.num_prefix_tokens else dataclasses.replace(
                spec, num_prefix_tokens=group.num_prefix, prefix_kinds=(), grid=tuple(group.grid))
            pixels = group.pixels.to(self.device) if group.pixels is not None else None
            batch = self._batch(pixels, loaded, group.positions, group_spec, tuple(group.grid), group.tokens)
            self.grids[tuple(group.grid)] = self.grids.get(tuple(group.grid), 0) + len(group.positions)
            for name in in_block_order(group.tokens):  # recorded whole here: streamed after the forward
                for a in self.stream.streams.get(name, ()):
                    a.update_hook(name, group.tokens[name], batch)
            yield group.tokens, batch

    def _forward(self, pixels: torch.Tensor, loaded: LoadedBatch, positions: Sequence[int]) -> Batch:
        """Run the model on one group of the batch, feeding every hook to the analyses as the model makes it."""
        spec = self.backbone.spec
        grid = spec.grid_for(*pixels.shape[-2:])
        batch = self._batch(pixels, loaded, positions, spec, grid, self.record)
        self.grids[grid] = self.grids.get(grid, 0) + len(positions)

        def reduce(name: str, tensor: torch.Tensor) -> None:  # one hook, the moment the model makes it
            self._feed(name, tensor, batch)

        with self.record.reducing(self.stream.reduced, reduce, self.stream.kept), self.autocast, \
                running_images(batch.indices):  # edits that take another image's tensors choose it by index
            self.backbone(pixels)
        return batch

    def _feed(self, name: str, tensor: torch.Tensor, batch: Batch) -> None:
        # called from inside the forward: the reductions run without its autocast (a matrix product such as
        # rollout's would otherwise run in bf16 and depend on the batch), as they do after the forward
        with _without_autocast(tensor.device.type):
            if name in self.stream.patterns:
                batch.shared.add_block(self.stream.patterns[name], tensor, batch)
            for a in self.stream.streams.get(name, ()):
                a.update_hook(name, tensor, batch)

    def _batch(self, pixels: torch.Tensor | None, loaded: LoadedBatch, positions: Sequence[int], spec: Any,
               grid: tuple[int, int], record: Mapping[str, torch.Tensor]) -> Batch:
        every = len(positions) == len(loaded.indices)
        pick = (lambda values: list(values)) if every else (lambda values: [values[j] for j in positions])
        frame = None if self.view is None else functools.partial(view_frame, self.view, self.backbone.spec)
        return Batch(pixels=pixels, indices=pick(loaded.indices), paths=pick(loaded.paths), spec=spec, grid=grid,
                     targets={k: pick(v) for k, v in loaded.targets.items()},
                     shared=SharedQuantities(record, self.plan, self.workspace, self.compile_stats),
                     model=ModelRunner(self.backbone, self.record, pick(loaded.indices)), frame=frame)


def _without_autocast(device_type: str) -> contextlib.AbstractContextManager:
    """Autocast off on ``device_type`` where it is on (a no-op context elsewhere)."""
    try:
        on = torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type autocast does not know
        on = False
    return torch.autocast(device_type, enabled=False) if on else contextlib.nullcontext()


def view_frame(view: Any, spec: ModelSpec, image: Any, resample: Any = None) -> Any:
    """``Batch.frame`` under a view: the view's geometry from an original image to the model's frame."""
    return view.transform(image, spec, resample)


def _tile_numbers(positions: Sequence[int]) -> list[int]:
    """Each row's tile of its image: the tiles of one image repeat its position and come in one forward."""
    seen: dict[int, int] = {}
    out = []
    for j in positions:
        out.append(seen.get(j, 0))
        seen[j] = out[-1] + 1
    return out
