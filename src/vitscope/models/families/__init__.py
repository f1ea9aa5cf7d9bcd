"""One descriptor file per Hugging Face family (:class:`vitscope.models.family.HFFamily`); importing this
package registers them all (every module here not starting with ``_``: adding a family is adding a file), and it
is where the adapters look a family up."""

from __future__ import annotations

import importlib
import pkgutil

from vitscope.errors import VitscopeKeyError
from vitscope.models.family import HFFamily, registered_families

__all__ = ["get_family", "hf_families"]

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")


def hf_families() -> dict[str, HFFamily]:
    """Every registered family by name."""
    return registered_families()


def get_family(name: str) -> HFFamily:
    """The descriptor of family ``name``.

    Raises:
        KeyError: an unsupported family (the message lists the supported ones).
    """
    families = registered_families()
    if name not in families:
        raise VitscopeKeyError(f"model type '{name}' is not supported; supported: {', '.join(sorted(families))}")
    return families[name]
