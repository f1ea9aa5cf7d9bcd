"""A command's options object from ``--config`` and the command line (:mod:`vitscope.workflows.options`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from vitscope.cli.errors import PASS_BATCH
from vitscope.workflows.options import PassOptions, option_fields, resolve

__all__ = ["resolve_or_exit"]

Options = TypeVar("Options", bound=PassOptions)


def resolve_or_exit(kind: type[Options], params: Mapping[str, Any]) -> Options:
    """The options object ``kind`` (:class:`~vitscope.workflows.options.AnalyzeOptions`...) from a command's
    parameters (``ctx.params``: named as the object's fields, plus ``config``) merged with its ``--config`` file.

    Raises:
        ConfigError: a bad or missing option, which the command's :func:`~vitscope.cli.errors.one_line_errors`
            reports as bad usage (one line, exit status 2).
    """
    given = {k: (params[k] or None) if isinstance(params[k], (list, tuple)) else params[k]  # no --param: []
             for k in option_fields(kind) if k in params}
    options = resolve(kind, given, params.get("config"))
    PASS_BATCH.set(options.batch_size)  # a pass whose numbers do not depend on it
    return options
