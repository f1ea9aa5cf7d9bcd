"""Compare two results.json documents number by number (the engine-v2 refactor must not move any number).

A document is first normalised: run-specific values (temporary paths, timestamps, file-stat fingerprints, the
environment) are replaced or dropped, so what remains is what the analyses measured. Numbers then match when
``|a - b| <= atol + rtol * max(|a|, |b|)`` (both 1e-6 by default); NaN equals NaN, and a NaN or infinity of the
expected document equals null (results.json writes numbers that are not finite as null since issue 34; fixtures
written before keep NaN); strings, booleans, None and the structure (keys, lengths) must match exactly. Integers
are compared as numbers: counts and indices are integers on both sides, and any difference in them exceeds the
tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

#: Number by number, relative and absolute.
TOLERANCE = 1e-6
#: Float32 convolutions round differently on different CPUs (oneDNN picks AVX2 or AVX-512 code): a CNN's
#: activations move by up to ~5e-6 between two Xeons with the code unchanged (the default CNN analysis, whose
#: unnormalised variances and maps reach that; compare and the demo stay within 1e-6). Runs that need it say so; a
#: refactor that changes a computation moves numbers by orders more. (Checked: the commit that wrote the CNN
#: fixture, run on an AVX-512 Xeon, moves the same numbers by the same amounts as today's code does there.)
CNN_TOLERANCE = 1e-5
#: Measurements that count images, under any key of this name: k-means (clustering purity) assigns an image near a tie
#: between two clusters by features that move at 1e-6 between CPUs, so one image of the demo's ~500 flips
#: (tiny-vit-distill's block 2 reads 0.612 on some Xeons and 0.614 on others with the code unchanged). A change
#: of the computation moves these by more than two images.
COUNT_TOLERANCE = {"clustering_purity": 0.005}
#: Top-level keys that describe the run, not the measurements.
RUN_KEYS = ("environment", "vitscope_version", "run")
#: Keys dropped wherever they occur: file lists (the writer may lay files out anew; the report and its
#: figures are checked elsewhere) and stat-based digests (they change with every file's mtime).
DROPPED_ANYWHERE = ("files", "digest")


def normalise(doc: Any, roots: Iterable[tuple[str, str]] = ()) -> Any:
    """A copy of ``doc`` without run-specific values; every string has each ``(path, placeholder)`` replaced.

    Args:
        doc: a results.json document (or any JSON value).
        roots: ``(absolute path, placeholder)`` pairs, longest first is not required (sorted here).
    """
    pairs = sorted(((str(p), tag) for p, tag in roots), key=lambda pair: -len(pair[0]))

    def walk(value: Any, top: bool) -> Any:
        if isinstance(value, Mapping):
            return {k: walk(v, False) for k, v in value.items()
                    if k not in DROPPED_ANYWHERE and not (top and k in RUN_KEYS)}
        if isinstance(value, list):
            return [walk(v, False) for v in value]
        if isinstance(value, str):
            for path, tag in pairs:
                value = value.replace(path, tag)
            return value
        return value

    return walk(doc, True)


def _close(a: float, b: float, rtol: float, atol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= atol + rtol * max(abs(a), abs(b))


def _short(value: Any, width: int = 160) -> str:
    """``repr`` cut to ``width`` characters (a moved array must not flood the report)."""
    text = repr(value)
    return text if len(text) <= width else f"{text[:width]}... ({len(text)} characters)"


def differences(expected: Any, actual: Any, rtol: float = TOLERANCE, atol: float = TOLERANCE,
                allow_extra: bool = False, limit: int = 40) -> list[str]:
    """Every place where ``actual`` differs from ``expected`` (at most ``limit``), as ``path: what`` lines.

    ``allow_extra`` accepts keys that only ``actual`` has (results.json may gain keys, never lose them).
    """
    found: list[str] = []

    def visit(e: Any, a: Any, where: str, atol: float = atol) -> None:
        if len(found) >= limit:
            return
        number = (int, float)
        if isinstance(e, float) and not math.isfinite(e) and a is None:
            return
        if isinstance(e, bool) or isinstance(a, bool):
            if e is not a:
                found.append(f"{where}: expected {_short(e)}, got {_short(a)}")
        elif isinstance(e, number) and isinstance(a, number):
            if not _close(float(e), float(a), rtol, atol):
                found.append(f"{where}: expected {e!r}, got {a!r} (difference {float(a) - float(e):.3g})")
        elif isinstance(e, Mapping) and isinstance(a, Mapping):
            missing, extra = sorted(set(e) - set(a)), sorted(set(a) - set(e))
            if missing:
                found.append(f"{where}: missing keys {missing}")
            if extra and not allow_extra:
                found.append(f"{where}: unexpected keys {extra}")
            for key in e:
                if key in a:
                    visit(e[key], a[key], f"{where}.{key}", max(atol, COUNT_TOLERANCE.get(key, 0.0)))
        elif isinstance(e, list) and isinstance(a, list):
            if len(e) != len(a):
                found.append(f"{where}: expected {len(e)} items, got {len(a)}")
                return
            for i, (x, y) in enumerate(zip(e, a)):
                visit(x, y, f"{where}[{i}]", atol)
        elif e != a or type(e) is not type(a):
            found.append(f"{where}: expected {_short(e)}, got {_short(a)}")

    visit(expected, actual, "$")
    return found
