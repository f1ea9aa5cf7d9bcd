"""Model-loading errors, importable without pulling in transformers."""


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message is one line saying why and what to do."""
