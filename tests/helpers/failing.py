"""An analysis that raises from a given image on: how the tests stop a pass in its middle."""

from __future__ import annotations

from vitscope.analyses.base import Analysis


class FailingAnalysis(Analysis):
    """Raises ``RuntimeError(message)`` in the first batch holding image ``at`` or later (reads block 0's output)."""

    name = "failing"

    def __init__(self, at: int, message: str = "an analysis fails") -> None:
        super().__init__()
        self._cfg_at, self._cfg_message = int(at), message

    def required_hooks(self, spec):
        return ["blocks.0.resid_post"]

    def update(self, record, batch):
        if max(batch.indices) >= self._cfg_at:
            raise RuntimeError(self._cfg_message)

    def compute(self):
        return {}
