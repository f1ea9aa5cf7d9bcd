"""Turn expected failures into one line on stderr and exit status 1 (bad usage is typer's 2)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import typer


def _expected_errors() -> tuple[type[BaseException], ...]:
    from vitscope.data.images import EmptyDatasetError, ImageLoadError
    from vitscope.engine.distributed import PeerFailedError
    from vitscope.engine.run import EmptyRunError
    from vitscope.hooks.names import UnknownHookError
    from vitscope.models.errors import ModelLoadError

    return (ModelLoadError, EmptyDatasetError, ImageLoadError, EmptyRunError, UnknownHookError, PeerFailedError,
            ValueError, TypeError, FileNotFoundError, PermissionError)


def one_line_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for CLI commands: expected errors print ``error: <message>`` and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except _expected_errors() as err:
            message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            print(f"error: {message}", file=sys.stderr)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise typer.Exit(130) from None

    return wrapper


def one_line_warnings() -> None:
    """Print vitscope's own warnings (a skipped image, a batch too large for memory) as ``warning: <message>``
    on stderr, without Python's source line; other libraries' warnings keep Python's format."""
    import warnings

    if getattr(warnings.showwarning, "_vitscope", False):
        return
    original = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        if category.__module__.split(".")[0] == "vitscope":
            print(f"warning: {message}", file=file or sys.stderr)
        else:
            original(message, category, filename, lineno, file, line)

    show._vitscope = True  # type: ignore[attr-defined]
    warnings.showwarning = show
