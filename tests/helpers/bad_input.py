"""Shared steps of the bad-input catalogue (docs/errors.md; tests/badinput/): build a bad input, run the command
in this process, and check what the user sees: one ``error:`` line and the exit status, or one ``warning:`` line
and a finished run."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from helpers.cli import cli

MODEL = "tiny-vit"


def picture(path: Path, size: tuple[int, int] = (50, 40), seed: int = 0, mode: str = "RGB") -> Path:
    """A random picture of ``size`` (width, height) saved at ``path`` (format from the suffix)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).convert(mode).save(path)
    return path


def folder_with_one_good_image(root: Path, name: str = "photos") -> Path:
    """``root/name`` holding one readable picture, ``good.png``, beside which a test puts its bad file."""
    folder = root / name
    picture(folder / "good.png")
    return folder


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares ``width x height`` but holds almost no pixel data (a bomb's header, cheaply)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\0" * 10)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def analyze(data: Path | str, out: Path, *extra: str, env: dict | None = None,
            analyses: str = "attention_stats") -> subprocess.CompletedProcess:
    """``vitscope analyze`` of the tiny model over ``data`` into ``out`` (in this process)."""
    return cli("analyze", "-m", MODEL, "-d", str(data), "-o", str(out), "-a", analyses, *extra, env=env)


def one_error(result: subprocess.CompletedProcess, needle: str, status: int = 1) -> str:
    """The command failed with ``status`` and one ``error:`` line containing ``needle``, and no traceback."""
    assert result.returncode == status, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], result.stderr
    return errors[0]


def finished(result: subprocess.CompletedProcess, out: Path) -> dict[str, Any]:
    """The command succeeded and wrote results.json; returns it."""
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads((out / "results.json").read_text())


def warned(result: subprocess.CompletedProcess, needle: str) -> str:
    """One ``warning:`` line on stderr contains ``needle``; returns it."""
    lines = [line for line in result.stderr.splitlines() if line.startswith("warning:") and needle in line]
    assert len(lines) == 1, result.stderr
    return lines[0]


def skipped(doc: dict[str, Any]) -> dict[str, str]:
    """results.json's skipped files: file name -> reason."""
    return {Path(s["path"]).name: s["reason"] for s in doc["skipped"]}


def copy_world(world: Path, to: Path) -> Path:
    """A private copy of a session-wide synthetic dataset that a test may damage."""
    shutil.copytree(world, to)
    return to


def edit_json(path: Path, edit) -> None:
    """Load ``path``, let ``edit(doc)`` change it in place, write it back."""
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
