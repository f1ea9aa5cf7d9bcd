"""The one error hierarchy: every error vitscope raises on purpose derives from :class:`VitscopeError`.

Each keeps the built-in base a caller may already catch (``except ValueError`` still works). The command line
turns these, and only these, into one ``error: <message>`` line; anything else escaping a command is a bug in
vitscope and is shown with its traceback and a request to report it.
"""

from __future__ import annotations

__all__ = ["DegenerateDataError", "Terminated", "VitscopeError", "VitscopeFileNotFoundError", "VitscopeKeyError",
           "VitscopeRuntimeError", "VitscopeTypeError", "VitscopeUsageError", "VitscopeValueError", "VitscopeWarning"]


class VitscopeError(Exception):
    """Base of every error vitscope raises on purpose (bad input, a missing file, an impossible request)."""


class VitscopeValueError(VitscopeError, ValueError):
    """A value given to vitscope is wrong: an option, a parameter, a tensor's shape, a data file's content."""


class VitscopeUsageError(VitscopeValueError):
    """A value the user gave that the command cannot take (an unknown device, dtype, analysis or parameter):
    bad usage, which the command line answers with exit status 2."""


class DegenerateDataError(VitscopeValueError):
    """Data an analysis cannot score: no labels, one class, one region class, no train/test split, no masks."""


class VitscopeTypeError(VitscopeError, TypeError):
    """An argument of the wrong kind (a model that is not a Backbone, a state that cannot be saved...)."""


class VitscopeKeyError(VitscopeError, KeyError):
    """A name vitscope does not know (a hook, a zoo model, a cache column); its message prints unquoted."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class VitscopeWarning(UserWarning):
    """A warning of vitscope's own without a class of its kind (the command line prints it as one line)."""


class VitscopeFileNotFoundError(VitscopeError, FileNotFoundError):
    """A file or folder vitscope was pointed at does not exist."""


class VitscopeRuntimeError(VitscopeError, RuntimeError):
    """A request that cannot be carried out here (no CUDA, a peer process failed, an empty run...)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, the stop a batch scheduler sends before it kills a job: handled as Ctrl-C is (the batch in flight
    finishes and the state is saved), so code that cleans up after ``KeyboardInterrupt`` cleans up after it too."""

