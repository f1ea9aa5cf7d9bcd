import os
import sys
from pathlib import Path

# Tests never touch the network: transformers and the hub must work from local files only.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker per core (make test): more threads each only contend
    os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).parent))


import pytest

pytest.register_assert_rewrite("helpers")  # asserts inside shared helpers report their values too


@pytest.fixture
def one_thread():
    """Tiny models and sets: one intra-op thread is faster and avoids OpenMP stalls on a busy machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def clean_registry():
    """Analyses and groups a test registers do not outlive it."""
    from vitscope.analyses import registry

    analyses, groups = dict(registry.ANALYSES), dict(registry.GROUPS)  # reading them loads the built-ins
    yield
    registry._ANALYSES.clear()
    registry._ANALYSES.update(analyses)
    registry._GROUPS.clear()
    registry._GROUPS.update(groups)


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """docs/extending.md's plug-in layout as the working directory (``my_lab/token_norm.py``, ``photos/``)."""
    from helpers.plugin_lab import doc_lab

    with doc_lab(tmp_path, monkeypatch) as folder:
        yield folder


@pytest.fixture
def small_heldout(monkeypatch):
    """The zoo's held-out sets at 40 + 30 scenes (a build scores on them), cached only for the test."""
    from vitscope.zoo import heldout

    monkeypatch.setattr(heldout, "BANK_SIZE", 40)
    monkeypatch.setattr(heldout, "TEST_SIZE", 30)
    heldout.heldout_sets.cache_clear()
    yield
    heldout.heldout_sets.cache_clear()
