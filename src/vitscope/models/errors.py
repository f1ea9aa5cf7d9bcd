"""Model-loading errors, importable without pulling in transformers."""

from vitscope.errors import VitscopeRuntimeError


class ModelLoadError(VitscopeRuntimeError):
    """A model could not be loaded; the message is one line saying why and what to do."""
