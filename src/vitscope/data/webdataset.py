"""WebDataset tar shards as a :class:`~vitscope.data.source.Source` (``--data "shards/{0..127}.tar::webdataset"``).

A shard is a plain tar file whose members are grouped into samples by key: the member's path up to the first dot
of its file name (``n01440764/ILSVRC2012_val_00000293.jpg`` and ``.cls`` form one sample). A sample's image is its
``jpg``, ``jpeg``, ``png`` or ``webp`` member; its label the integer in its ``cls`` member, or the ``label`` (else
``cls``) field of its ``json`` member; a label member that holds no integer (``dog``) leaves its sample unlabelled,
and :meth:`~WebDatasetSource.labels` warns how many did. A member is matched by its whole extension, else, when no
member has that extension, by the extension's last part (``n01440764_10026.JPEG.jpg`` is a ``jpg``, as the
``webdataset`` package decodes; ``x.seg.png`` beside ``x.webp`` is no image of ``x``). Hidden members (macOS's
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
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vitscope.data.formats.errors import DatasetFormatError
from vitscope.data.images import ImageLoadError, decode_rgb
from vitscope.data.source import Source

__all__ = ["UnreadableLabelWarning", "WebDatasetSource", "expand_braces", "open_webdataset"]

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
#: how a sample gets its label (results.json ``data.label_rule``)
LABEL_RULE = ("the integer in the sample's cls member, else the label (else cls) field of its json member; "
              "a sample with neither, or with no integer there, is unlabelled")
_BRACES = re.compile(r"\{(\d+)\.\.(\d+)\}")


class UnreadableLabelWarning(UserWarning):
    """Label members that hold no integer (``dog``, ``1.0``, a ``json`` label that is a name): those samples are
    read as unlabelled."""


def expand_braces(pattern: str) -> list[str]:
    """``shards/{000000..000002}.tar`` -> the three names (zero padding kept; several ranges multiply; a descending
    range such as ``{3..1}`` counts down, as in bash)."""
    match = _BRACES.search(pattern)
    if match is None:
        return [pattern]
    first, last = match.group(1), match.group(2)
    # as bash and braceexpand: a leading zero on either end pads every number to the longer end's width
    padded = any(len(end) > 1 and end.startswith("0") for end in (first, last))
    width = max(len(first), len(last)) if padded else 0
    head, tail = pattern[:match.start()], pattern[match.end():]
    step = 1 if int(first) <= int(last) else -1
    numbers = range(int(first), int(last) + step, step)
    return [name for n in numbers for name in expand_braces(f"{head}{n:0{width}d}{tail}")]


@dataclass(frozen=True)
class _Member:
    shard: int
    offset: int
    size: int


#: open shards kept per process: reading is contiguous, and a thousand shards would exceed the open-file limit
_OPEN_SHARDS = 8
#: the most bytes read for one member: a header may declare any size (a sparse file holds it in a few blocks), and
#: the read allocates what it declares
_MAX_IMAGE_BYTES = 512 * 2**20
_MAX_LABEL_BYTES = 2**20


def _split_key(name: str) -> tuple[str, str] | None:
    """``dir/base.ext.more`` -> ``("dir/base", "ext.more")`` (the WebDataset convention); None for a hidden member
    (``._a.jpg``, ``__MACOSX/...``: no sample's)."""
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    if not stem or base.startswith(".") or "__MACOSX" in folder.split("/"):
        return None
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


def _part(parts: dict[str, _Member], wanted: Sequence[str]) -> tuple[str, _Member] | None:
    """``(extension, member)`` of the first of ``wanted`` a member has as its whole extension; only when none has,
    the first matched by the extension's last part (``jpeg.jpg`` is a jpg; ``seg.png`` beside a ``webp`` is not
    the image)."""
    exact = next((ext for ext in wanted if ext in parts), None)
    if exact is not None:
        return exact, parts[exact]
    for ext in wanted:
        found = next((m for full, m in parts.items() if full.rsplit(".", 1)[-1] == ext), None)
        if found is not None:
            return ext, found
    return None


def _parse_label(text: str, kind: str) -> int | None:
    """The integer label of a ``cls`` or ``json`` member's text; None when a ``json`` member names no label.

    Raises:
        ValueError: the member holds something else than an integer label.
    """
    if kind == "cls":
        return int(text)
    doc = json.loads(text)
    value = doc.get("label", doc.get("cls")) if isinstance(doc, dict) else None
    if value is None:
        return None
    if not isinstance(value, (int, float, str)) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"not an integer: {value!r}")  # int() would truncate 1.5 or fail with a TypeError
    return int(value)


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
        origin: what the shards were named by (their pattern or folder; default: the first shard's folder).
    """

    def __init__(self, shards: Sequence[str | Path], name: str, strict: bool = False,
                 origin: str | None = None) -> None:
        super().__init__(strict=strict)
        self.name, self.shards = name, [str(s) for s in shards]
        self.origin = origin if origin is not None else str(Path(self.shards[0]).parent) if self.shards else ""
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
                image, label = _part(parts, IMAGE_EXTENSIONS), _part(parts, ("cls", "json"))
                self._images.append(image[1] if image else None)
                self._labels.append(label[1] if label else None)
                self._label_kinds.append(label[0] if label else "")
        if not keys:
            raise DatasetFormatError(f"no samples in the WebDataset shards {', '.join(self.shards[:3])}")
        self.paths = keys
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()
        self._all_labels: np.ndarray | None = None  # read once by labels(): its warning is given once

    def _read(self, member: _Member, i: int, most: int = _MAX_IMAGE_BYTES) -> bytes:
        if member.size > most:
            kind = "an image" if most == _MAX_IMAGE_BYTES else "a label"
            raise ImageLoadError(self.path(i), f"its member declares {member.size} bytes, more than the "
                                 f"{most // 2**20} MiB vitscope reads for {kind}")
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

    # the modules close() needs, held by the class: at interpreter exit (__del__) this module's globals may be gone
    _os, _contextlib = os, contextlib

    def close(self) -> None:
        """Close the shards this process has open (reading again reopens them)."""
        if getattr(self, "_pid", None) == self._os.getpid():
            for fd in getattr(self, "_fds", {}).values():
                with self._contextlib.suppress(OSError):
                    self._os.close(fd)
        self._fds = {}

    def __del__(self) -> None:
        self.close()

    def load(self, i: int) -> Image.Image:
        member = self._images[i]
        if member is None:
            raise ImageLoadError(self.path(i), f"the sample has no image member ({', '.join(IMAGE_EXTENSIONS)})")
        return decode_rgb(io.BytesIO(self._read(member, i)), self.path(i))

    def _label_text(self, i: int) -> str | None:
        member = self._labels[i]
        return None if member is None else \
            self._read(member, i, _MAX_LABEL_BYTES).decode("utf-8", errors="replace").strip()

    def _label(self, i: int) -> int | None:
        text = self._label_text(i)
        try:
            return None if text is None else _parse_label(text, self._label_kinds[i])
        except ValueError:
            return None

    def targets(self, i: int) -> dict[str, Any]:
        label = self._label(i)
        return {} if label is None or label < 0 else {"label": label}

    def labels(self) -> np.ndarray:
        """``[n]`` int64 labels read from the label members alone (no image is read; -1 where unknown), warning
        once (:class:`UnreadableLabelWarning`) how many label members hold no integer.

        Raises:
            ValueError: no sample has a label.
        """
        if self._all_labels is None:
            self._all_labels = self._read_labels()
        if not len(self._all_labels) or (self._all_labels < 0).all():
            raise self._no_labels()
        return self._all_labels.copy()

    def _read_labels(self) -> np.ndarray:
        out = np.full(len(self), -1, dtype=np.int64)
        bad: list[tuple[str, str]] = []
        for i in range(len(self)):
            try:
                text = self._label_text(i)
                label = None if text is None else _parse_label(text, self._label_kinds[i])
            except ImageLoadError:  # an unreadable shard: the sample is skipped when read, so it has no label
                continue
            except ValueError:
                bad.append((self.path(i), text or ""))
                continue
            out[i] = -1 if label is None else label
        if bad:
            path, text = bad[0]
            warnings.warn(f"{self.name}: {len(bad)} WebDataset sample(s) have a cls or json label that is not an "
                          f"integer (e.g. {path}: {text[:40]!r}); they are read as unlabelled",
                          UnreadableLabelWarning, stacklevel=3)
        return out

    def fingerprint_files(self) -> tuple[Sequence[str], Path] | None:
        return list(self.shards), Path(self.shards[0]).parent

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "source": self.origin, "format": "webdataset", "shards": len(self.shards),
                "label_rule": LABEL_RULE}

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
        return WebDatasetSource(shards, path.name, strict=strict, origin=str(root))
    shards = expand_braces(root)
    missing = [s for s in shards if not Path(s).is_file()]
    if missing:
        raise DatasetFormatError(f"{len(missing)} of {len(shards)} WebDataset shards are missing, e.g. {missing[0]}")
    return WebDatasetSource(shards, Path(shards[0]).parent.name or "webdataset", strict=strict, origin=str(root))
