"""What a run chose and left out, printed after it from its results.json: each model's input size, token grid and
origin of its preprocessing, and the analyses not run with the reason."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import typer

__all__ = ["echo_choices"]


def echo_choices(doc: Mapping[str, Any]) -> None:
    """Print (stdout) ``MODEL: input ...`` per model and ``NAME skipped: REASON`` per analysis not run."""
    from vitscope.models.spec import input_text

    for m in doc.get("models", []):
        if m.get("image_size") and m.get("grid"):
            typer.echo(f"{m.get('id', m.get('name'))}: input {input_text(m)}")
    for s in doc.get("skipped_analyses", []):
        typer.echo(f"{s['analysis']} skipped: {s['reason']}")
