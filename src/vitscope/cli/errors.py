"""How a command ends when something goes wrong.

* An error vitscope raises on purpose (:class:`vitscope.VitscopeError`: bad input, a missing model...) is one
  ``error: <message>`` line on stderr and exit status 1.
* The machine saying no (``OSError``: a full disk, a folder it may not write, a file that vanished) is one line
  too, naming the path; so is running out of memory on a batch, with the ``-b`` to try.
* Ctrl-C is ``interrupted`` and exit status 130 (finished work and the saved state stay on disk); SIGTERM (a batch
  scheduler's stop) is ``terminated`` and 143, after the same clean-up (a pass saves its state first).
* Anything else is a bug in vitscope: Python's traceback, then a line asking to report it, exit status 1.

Bad usage (an unknown option, a wrong type on the command line) is the parser's, one line with exit status 2
(:mod:`vitscope.cli.parser`); so is an option value that is wrong for the command
(:class:`~vitscope.workflows.options.ConfigError`: from the command line or ``--config``, or found wrong once the
model is loaded, such as a block it does not have), and the library's :class:`~vitscope.errors.VitscopeUsageError`.
"""

from __future__ import annotations

import contextlib
import functools
import math
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

import typer

from vitscope.cli.terminal import printable
from vitscope.errors import Terminated, VitscopeError, VitscopeUsageError
from vitscope.workflows.options import ConfigError

__all__ = ["one_line_errors", "one_line_warnings", "require_choice"]


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return printable(text.splitlines()[0]) if text else type(err).__name__


def _out_of_memory(err: BaseException) -> bool:
    import torch

    text = str(err).lower()
    return isinstance(err, torch.OutOfMemoryError) or (isinstance(err, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text or "defaultcpuallocator" in text))


#: the batch size of the pass a command resolved (analyze, compare, probe: no number depends on it), for the
#: out-of-memory advice; set by :func:`vitscope.cli.resolve.resolve_or_exit`
PASS_BATCH: ContextVar[int | None] = ContextVar("vitscope_pass_batch", default=None)


def out_of_memory_advice(pass_batch: int | None, batch_size: int | None = None) -> str:
    """What to do after running out of memory.

    Args:
        pass_batch: the resolved batch size of a command whose numbers do not depend on it (its saved state
            resumes at any size, and memory falls with it): a smaller one is the advice.
        batch_size: the ``-b`` of another command (a training batch may change its numbers: no such promise).
    """
    if isinstance(pass_batch, int) and pass_batch > 1:
        return (f"out of memory at a batch of {pass_batch}; run again with a smaller batch (--batch-size / -b "
                f"{pass_batch // 2}): no number depends on the batch size, and the saved state resumes at any size")
    if isinstance(pass_batch, int):
        return ("out of memory at one image a batch; run again with a smaller input (--image-size) or fewer analyses "
                "(--analyses) (finished work and the saved state stay on disk)")
    if isinstance(batch_size, int) and batch_size > 1:
        return f"out of memory at a batch of {batch_size}; run again with a smaller batch (--batch-size / -b " \
               f"{batch_size // 2})"
    return "out of memory; run again with a smaller input (--image-size) where the command has it"


def require_finite(option: str, value: float, bound: str = "") -> float:
    """``value`` when it is a finite number (a parser range with only a minimum lets infinity through, and NaN
    where it has none).

    Args:
        bound: what the message adds after "a finite number" (``">= 0"``), the range the parser checked.

    Raises:
        VitscopeUsageError: infinity or NaN (bad usage, exit status 2), naming ``option``.
    """
    if not math.isfinite(value):
        raise VitscopeUsageError(f"{option} must be a finite number{' ' + bound if bound else ''}, got {value}")
    return value


def require_choice(option: str, value: str, allowed: Sequence[str]) -> str:
    """``value`` when ``allowed`` holds it.

    Raises:
        VitscopeUsageError: another value (bad usage, exit status 2), naming ``option`` and the choices.
    """
    if value not in allowed:
        raise VitscopeUsageError(f"{option} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def one_line_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for CLI commands: the module docstring's rules."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        PASS_BATCH.set(None)
        try:
            with _terminate_raises():
                return fn(*args, **kwargs)
        except SystemExit:
            raise
        except (ConfigError, VitscopeError) as err:  # bad usage (a value the command cannot take): status 2
            print(f"error: {_first_line(err)}", file=sys.stderr)
            raise typer.Exit(2 if isinstance(err, (ConfigError, VitscopeUsageError)) else 1) from None
        except OSError as err:
            print(f"error: {_first_line(err)}", file=sys.stderr)
            raise typer.Exit(1) from None
        except Terminated:
            print("terminated", file=sys.stderr)
            raise typer.Exit(128 + signal.SIGTERM) from None
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise typer.Exit(130) from None
        except Exception as err:
            if type(err).__module__.split(".")[0] in ("typer", "click"):
                raise  # typer's own: exits, aborts and usage errors (status 2)
            if "torch" in sys.modules and _out_of_memory(err):
                print(f"error: {out_of_memory_advice(PASS_BATCH.get(), kwargs.get('batch_size'))}", file=sys.stderr)
                raise typer.Exit(1) from None
            from vitscope._version import __version__

            traceback.print_exc()
            print(f"error: this is a bug in vitscope {__version__} ({type(err).__name__}), not in your input; "
                  f"please report it with the command and the traceback above", file=sys.stderr)
            raise typer.Exit(1) from None

    return wrapper


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated


@contextlib.contextmanager
def _terminate_raises() -> Any:
    """SIGTERM raises :class:`~vitscope.errors.Terminated` while a command runs, so that its clean-up runs (the
    staging folder, the output lock) and a pass saves its state (:func:`vitscope.engine.state.interrupt_guard`)
    where the default action would end the process at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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
            print(f"warning: {printable(str(message))}", file=file or sys.stderr)
        else:
            original(message, category, filename, lineno, file, line)

    show._vitscope = True  # type: ignore[attr-defined]
    warnings.showwarning = show
    # vitscope's LargeImageWarning names the file; Pillow's own warning about the same image does not
    warnings.filterwarnings("ignore", message="Image size .* could be decompression bomb")
