"""``vitscope compare``: parsing lives in :mod:`vitscope.cli.main`; the work in :mod:`vitscope.workflows.compare`."""

from vitscope.workflows.compare import compare, compare_models

__all__ = ["compare", "compare_models"]
