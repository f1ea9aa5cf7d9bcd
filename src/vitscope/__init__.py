"""vitscope: put vision transformers under a microscope.

Public API: :func:`load_model`, :func:`wrap`, :func:`run`, :func:`tokens_to_grid`, the
``analyses`` and ``functional`` packages.
"""

from vitscope.hooks.tokens import tokens_to_grid
from vitscope.models.backbone import Backbone
from vitscope.models.load import load_model
from vitscope.models.spec import ModelSpec
from vitscope.models.wrap import wrap

__version__ = "0.1.0"

__all__ = ["Backbone", "ModelSpec", "__version__", "load_model", "run", "tokens_to_grid", "wrap"]


def __getattr__(name: str):
    if name == "run":  # the engine pulls in the data layer; import it on first use
        from vitscope.engine.run import run

        return run
    raise AttributeError(f"module 'vitscope' has no attribute '{name}'")
