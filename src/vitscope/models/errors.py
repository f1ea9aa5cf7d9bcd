"""Model-loading errors, importable without pulling in transformers."""

from vitscope.errors import VitscopeRuntimeError

#: set to 1 (``vitscope --trust-pickle``) to load a model directory whose weights are pickles
TRUST_PICKLE_ENV = "VITSCOPE_TRUST_PICKLE"


class ModelLoadError(VitscopeRuntimeError):
    """A model could not be loaded; the message is one line saying why and what to do."""
