"""The accumulator protocol every analysis follows (DESIGN.md idea 3) and the Result it returns."""

from __future__ import annotations

import copy
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from vitscope.models.spec import ModelSpec


@dataclass
class Batch:
    """What the engine hands to every analysis together with the recorded tensors.

    Attributes:
        pixels: ``[B, 3, H, W]`` preprocessed input (on the run's device).
        indices: dataset index of each image.
        paths: source path (or name) of each image.
        spec: the backbone's ModelSpec.
        grid: ``(h, w)`` token grid of this batch's input size.
        targets: optional per-image ground truth (labels, masks...) from the dataset.
    """

    pixels: torch.Tensor
    indices: list[int]
    paths: list[str]
    spec: ModelSpec
    grid: tuple[int, int]
    targets: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.indices)


@dataclass
class Result:
    """Output of ``Accumulator.compute()``: named tensors plus scalar metadata.

    Subclasses add ``plot()``; the base knows how to tabulate and save itself.
    """

    name: str
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def to_frame(self):
        """Long-format pandas table: one row per element of every tensor, with its index columns."""
        import pandas as pd

        frames = []
        for key, t in self.tensors.items():
            arr = t.detach().cpu().double()
            idx = torch.cartesian_prod(*[torch.arange(s) for s in arr.shape]) if arr.dim() > 1 else (
                torch.arange(arr.numel()).unsqueeze(1) if arr.dim() == 1 else torch.zeros(1, 0, dtype=torch.long)
            )
            cols = {f"dim{d}": idx[:, d].numpy() for d in range(idx.shape[1])}
            frames.append(pd.DataFrame({"quantity": key, **cols, "value": arr.reshape(-1).numpy()}))
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def summary(self) -> dict[str, Any]:
        """JSON-friendly summary: metadata plus small tensors as nested lists."""
        out: dict[str, Any] = dict(self.meta)
        for key, t in self.tensors.items():
            if t.numel() <= 4096:
                out[key] = t.detach().cpu().tolist()
            else:
                out[key] = {"shape": list(t.shape), "mean": float(t.double().mean())}
        return out

    def save(self, out_dir: str | Path) -> list[Path]:
        """Write ``<name>.csv`` (long table) and ``<name>.json`` (summary) into ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        csv_path = out / f"{self.name}.csv"
        self.to_frame().to_csv(csv_path, index=False)
        json_path = out / f"{self.name}.json"
        json_path.write_text(json.dumps(self.summary(), indent=1))
        return [csv_path, json_path]

    def plot(self, out_dir: str | Path) -> list[Path]:
        """Write the figures of this result; the base class has none."""
        return []


class Accumulator(ABC):
    """Streaming analysis with exactly mergeable state.

    Subclasses set ``name`` and implement ``required_hooks``, ``update``, ``compute``,
    ``merge`` / ``reset``. State lives in plain attributes (float64 tensors, ints, lists, dicts);
    configuration attributes start with ``_cfg_`` and stay out of ``state_dict()``.
    ``merge(other)`` folds ``other`` into ``self`` in place, leaves ``other`` unchanged, returns
    ``self``, and satisfies ``merge(A(x1), A(x2)) == A(x1 + x2)``. ``compute()`` on an empty
    accumulator returns a Result with no tensors.
    """

    name: ClassVar[str] = "accumulator"
    needs_attention: ClassVar[bool] = False

    @abstractmethod
    def required_hooks(self, spec: ModelSpec) -> list[str]:
        """Canonical hook names (patterns allowed) this analysis reads from the record."""
        ...

    def supports(self, spec: ModelSpec) -> bool:
        """Whether this analysis can run on ``spec``: no :meth:`why_unsupported` reason, and its hooks exist."""
        return self.why_unsupported(spec) is None and self.hooks_exist(spec)

    def why_unsupported(self, spec: ModelSpec) -> str | None:
        """One-line reason this analysis cannot run on ``spec`` (None when it can; subclasses add checks)."""
        return None

    def hooks_exist(self, spec: ModelSpec) -> bool:
        """Whether every hook this analysis needs exists on the model (attention needs a transformer)."""
        from vitscope.hooks.names import (
            UnknownHookError,
            cnn_hook_names,
            expand_names,
            transformer_hook_names,
        )

        if self.needs_attention and not spec.is_transformer:
            return False
        valid = transformer_hook_names(spec.num_blocks) if spec.is_transformer else cnn_hook_names(spec.num_blocks)
        try:
            expand_names(self.required_hooks(spec), valid, spec.name)
        except UnknownHookError:
            return False
        return True

    @abstractmethod
    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        ...

    @abstractmethod
    def merge(self, other: Accumulator) -> Accumulator:
        ...

    @abstractmethod
    def compute(self) -> Result:
        ...

    @abstractmethod
    def reset(self) -> None:
        ...

    def state_dict(self) -> dict[str, Any]:
        """State for resume and gathering: plain tensors, numbers, lists and dicts (no configuration)."""
        return copy.deepcopy({k: v for k, v in self.__dict__.items() if not k.startswith("_cfg_")})

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.__dict__.update(copy.deepcopy(dict(state)))

    def fresh(self) -> Accumulator:
        """An empty copy with the same configuration."""
        twin = copy.deepcopy(self)
        twin.reset()
        return twin
