"""Every JSON a run wrote, parsed as JSON is defined: ``NaN`` and ``Infinity`` (which Python's json writes and
reads, and JavaScript's ``JSON.parse`` refuses) are errors. The files (results.json, tables, charts, the manifest,
a feature cache's metadata) and the JSON embedded in every report.html are read."""

from __future__ import annotations

import json
import re
from pathlib import Path

#: the report's embedded JSON (charts, colour keys, pair explorers); the template escapes ``<`` inside it
EMBEDDED = re.compile(r'<script type="application/json"[^>]*>(.*?)</script>', re.S)


def _refuse(token: str) -> None:
    raise ValueError(f"{token} is not JSON")


def strict_loads(text: str):
    """``json.loads`` that refuses ``NaN``, ``Infinity`` and ``-Infinity``."""
    return json.loads(text, parse_constant=_refuse)


def not_json(folder: Path) -> list[str]:
    """``file: error`` for every JSON file under ``folder`` (hidden ones too) and every JSON block of its
    report.html files that a strict parser refuses; empty when all parse."""
    found = []
    texts = [(p, p.read_text(encoding="utf-8")) for p in sorted(folder.rglob("*.json"))]
    for page in sorted(folder.rglob("report.html")):
        texts += [(page, block) for block in EMBEDDED.findall(page.read_text(encoding="utf-8"))]
    for path, text in texts:
        try:
            strict_loads(text)
        except ValueError as error:
            found.append(f"{path.relative_to(folder)}: {error}")
    return found
