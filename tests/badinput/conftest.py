"""Session-wide synthetic datasets that the bad-input tests copy and damage."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def coco_world(tmp_path_factory) -> Path:
    """A small COCO-format synthetic world (4 images of 32 px, masks of several classes)."""
    from vitscope.data.synthetic.write import synthesize

    root = tmp_path_factory.mktemp("coco_world")
    synthesize(root, "coco", n=4, size=32, seed=0)
    return root
