"""The one error every dataset-format reader and writer raises, and the path check they share.

``DatasetFormatError`` messages are a single line that names the offending entry (file, line number,
sequence, pair or query) so a user can find and fix it without a traceback.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath, PureWindowsPath

from vitscope.errors import VitscopeValueError


class DatasetFormatError(VitscopeValueError):
    """A dataset on disk (or a writer's input) does not follow its format; the message is one line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


def safe_join(root: str | os.PathLike, relative: str, where: str) -> Path:
    """Join ``relative`` onto ``root``, refusing paths that could leave ``root``.

    Args:
        root: dataset root folder.
        relative: a path read from an annotation file (``/`` separated).
        where: what names the entry in the error, e.g. ``"line 12 of Ebay_test.txt"``.

    Returns:
        ``root / relative``.

    Raises:
        DatasetFormatError: ``relative`` is empty, absolute, or contains a ``..`` component.
    """
    rel = str(relative)
    parts = PurePosixPath(rel.replace("\\", "/")).parts
    if not rel.strip() or "\x00" in rel or rel.startswith(("/", "\\")) or PureWindowsPath(rel).drive or ".." in parts:
        raise DatasetFormatError(
            f"refusing unsafe path {rel!r} in {where}: paths must be relative and stay inside {root}"
        )
    return Path(root) / rel
