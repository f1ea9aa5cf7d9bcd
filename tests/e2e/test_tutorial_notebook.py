"""docs/tutorial.ipynb runs from top to bottom in a fresh Jupyter kernel, and its results show as HTML cards."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "tutorial.ipynb"


def test_the_tutorial_notebook_runs_and_shows_result_cards(tmp_path):
    nbformat = pytest.importorskip("nbformat", reason="install the dev extras: pip install -e '.[dev]'")
    nbclient = pytest.importorskip("nbclient", reason="install the dev extras: pip install -e '.[dev]'")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    cards = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert any("vitscope-card" in html and "Attention distance" in html and "<img" in html for html in cards)
    assert any("vitscope-card" in html and "CKA between final blocks" in html for html in cards)  # the comparison
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the paired map
