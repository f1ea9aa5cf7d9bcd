"""WebDataset tar shards as a :class:`~vitscope.data.source.Source` (``--data "shards/{0..127}.tar::webdataset"``).

A shard is a plain tar file whose members are grouped into samples by key: the member's path up to the first dot
of its file name (``n01440764/ILSVRC2012_val_00000293.jpg`` and ``.cls`` form one sample). A sample's image is its
``jpg``, ``jpeg``, ``png`` or ``webp`` member; its label the integer in its ``cls`` member, or the ``label`` (else
``cls``) field of its ``json`` member. A member is matched by its extension, else by the extension's last part
(``n01440764_10026.JPEG.jpg`` is a ``jpg``), as the ``webdataset`` package decodes. Hidden members (macOS's
``._*`` and ``__MACOSX/``) are not samples. Shards are read in the order the pattern (or the folder's sorted
listing) gives them, samples in the order they appear; a shard cut short (no end-of-archive blocks, or a member
running past the end of the file) is refused by name rather than read in part.

Nothing is unpacked: opening a source reads the tar headers only (the index of every member's offset and size),
and an image is read by position with one ``pread`` at its offset, so a torchrun rank reads its contiguous part of
the positions (:func:`vitscope.engine.batches.shard_range`: whole shards but at its edges) and a resumed pass
starts mid-shard. Written with the standard library's ``tarfile`` (the ``webdataset`` package streams shards but
does not index them for reading by position). The fingerprint is the shards' sizes and times.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from vitscope.data.formats.errors import DatasetFormatError
from vitscope.data.images import ImageLoadError, decode_rgb
from vitscope.data.source import Source

__all__ = ["WebDatasetSource", "expand_braces", "open_webdataset"]

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
_BRACES = re.compile(r"\{(\d+)\.\.(\d+)\}")


def expand_braces(pattern: str) -> list[str]:
    """``shards/{000000..000002}.tar`` -> the three names (zero padding kept; several ranges multiply)."""
    match = _BRACES.search(pattern)
    if match is None:
        return [pattern]
    first, last = match.group(1), match.group(2)
    # as bash and braceexpand: a leading zero on either end pads every number to the longer end's width
    padded = any(len(end) > 1 and end.startswith("0") for end in (first, last))
    width = max(len(first), len(last)) if padded else 0
    head, tail = pattern[:match.start()], pattern[match.end():]
    return [name for n in range(int(first), int(last) + 1) for name in expand_braces(f"{head}{n:0{width}d}{tail}")]


@dataclass(frozen=True)
class _Member:
    shard: int
    offset: int
    size: int


#: open shards kept per process: reading is contiguous, and a thousand shards would exceed the open-file limit
_OPEN_SHARDS = 8


def _split_key(name: str) -> tuple[str, str] | None:
    """``dir/base.ext.more`` -> ``("dir/base", "ext.more")`` (the WebDataset convention); None for a hidden member
    (``._a.jpg``, ``__MACOSX/...``: no sample's)."""
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    if not stem or base.startswith(".") or "__MACOSX" in folder.split("/"):
        return None
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


def _part(parts: dict[str, _Member], wanted: str) -> _Member | None:
    """The member of extension ``wanted``: exactly, else by the extension's last part (``jpeg.jpg`` is a jpg)."""
    if wanted in parts:
        return parts[wanted]
    return next((m for ext, m in parts.items() if ext.rsplit(".", 1)[-1] == wanted), None)


def _check_complete(tar: tarfile.TarFile, shard: str, last: str | None) -> None:
    """Refuse a shard cut short: a member past the end of the file, or no end-of-archive blocks after the last."""
    size = os.fstat(tar.fileobj.fileno()).st_size
    for info in tar.getmembers():
        if info.isfile() and info.offset_data + info.size > size:
            raise DatasetFormatError(f"the WebDataset shard {shard} is cut short: {info.name} runs past the end of "
                                     f"the file ({size} bytes); copy or download it again")
    tar.fileobj.seek(tar.offset)
    if tar.fileobj.read(2 * tarfile.BLOCKSIZE) != bytes(2 * tarfile.BLOCKSIZE):
        raise DatasetFormatError(f"the WebDataset shard {shard} is cut short: no end-of-archive blocks after "
                                 f"{last or 'its first member'} ({size} bytes); copy or download it again")


class WebDatasetSource(Source):
    """The samples of WebDataset shards (module docstring).

    Args:
        shards: the tar files, in reading order.
        name: what results.json calls the data.
        strict: :meth:`get` raises on unreadable images.
    """

    def __init__(self, shards: Sequence[str | Path], name: str, strict: bool = False) -> None:
        super().__init__(strict=strict)
        self.name, self.shards = name, [str(s) for s in shards]
        self._images: list[_Member | None] = []
        self._labels: list[_Member | None] = []
        self._label_kinds: list[str] = []
        keys: list[str] = []
        for k, shard in enumerate(self.shards):
            samples: dict[str, dict[str, _Member]] = {}
            try:
                with tarfile.open(shard, mode="r:") as tar:  # headers only: data blocks are skipped
                    last = None
                    for info in tar:
                        split = _split_key(info.name) if info.isfile() else None
                        if split is not None:
                            samples.setdefault(split[0], {})[split[1]] = _Member(k, info.offset_data, info.size)
                        last = info.name
                    _check_complete(tar, shard, last)
            except (OSError, tarfile.TarError) as err:
                raise DatasetFormatError(f"cannot read the WebDataset shard {shard}: {err}") from None
            for key, parts in samples.items():
                keys.append(f"{Path(shard).name}/{key}")
                self._images.append(next((m for m in (_part(parts, e) for e in IMAGE_EXTENSIONS) if m), None))
                kind = "cls" if _part(parts, "cls") else "json" if _part(parts, "json") else ""
                self._labels.append(_part(parts, kind) if kind else None)
                self._label_kinds.append(kind)
        if not keys:
            raise DatasetFormatError(f"no samples in the WebDataset shards {', '.join(self.shards[:3])}")
        self.paths = keys
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()

    def _read(self, member: _Member, i: int) -> bytes:
        if self._pid != os.getpid():  # a forked loading worker opens its own files (the parent's stay its own)
            self._fds, self._pid = {}, os.getpid()
        try:
            fd = self._fds.pop(member.shard, None)
            if fd is None:
                fd = os.open(self.shards[member.shard], os.O_RDONLY)
            self._fds[member.shard] = fd  # the most recently read last
            while len(self._fds) > _OPEN_SHARDS:
                os.close(self._fds.pop(next(iter(self._fds))))
            data = os.pread(fd, member.size, member.offset)  # no shared file position: safe in threads and forks
        except OSError as err:
            raise ImageLoadError(self.path(i), f"cannot read its shard: {err.strerror or err}") from None
        if len(data) != member.size:
            raise ImageLoadError(self.path(i), f"its shard ends {member.size - len(data)} bytes early")
        return data

    def close(self) -> None:
        """Close the shards this process has open (reading again reopens them)."""
        if self._pid == os.getpid():
            for fd in self._fds.values():
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fds = {}

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def load(self, i: int) -> Image.Image:
        member = self._images[i]
        if member is None:
            raise ImageLoadError(self.path(i), f"the sample has no image member ({', '.join(IMAGE_EXTENSIONS)})")
        return decode_rgb(io.BytesIO(self._read(member, i)), self.path(i))

    def _label(self, i: int) -> int | None:
        member, kind = self._labels[i], self._label_kinds[i]
        if member is None:
            return None
        text = self._read(member, i).decode("utf-8", errors="replace").strip()
        try:
            if kind == "cls":
                return int(text)
            doc = json.loads(text)
            value = doc.get("label", doc.get("cls")) if isinstance(doc, dict) else None
            return None if value is None else int(value)
        except (ValueError, TypeError):
            return None

    def targets(self, i: int) -> dict[str, Any]:
        label = self._label(i)
        return {} if label is None or label < 0 else {"label": label}

    def fingerprint_files(self) -> tuple[Sequence[str], Path] | None:
        return list(self.shards), Path(self.shards[0]).parent

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "format": "webdataset", "shards": len(self.shards)}

    def __getstate__(self) -> dict[str, Any]:  # open files stay with their process
        state = dict(self.__dict__)
        state["_fds"] = {}
        return state


def open_webdataset(root: str, strict: bool = False) -> WebDatasetSource:
    """Shards named by a brace pattern (``shards/{000000..000127}.tar``), one tar file, or a folder of ``*.tar``.

    Raises:
        DatasetFormatError: no shard found, a missing shard (named), or an unreadable one.
    """
    path = Path(root)
    if path.is_dir():
        shards = sorted(str(p) for p in path.glob("*.tar"))
        if not shards:
            raise DatasetFormatError(f"no *.tar shards in {root}")
        return WebDatasetSource(shards, path.name, strict=strict)
    shards = expand_braces(root)
    missing = [s for s in shards if not Path(s).is_file()]
    if missing:
        raise DatasetFormatError(f"{len(missing)} of {len(shards)} WebDataset shards are missing, e.g. {missing[0]}")
    return WebDatasetSource(shards, Path(shards[0]).parent.name or "webdataset", strict=strict)
