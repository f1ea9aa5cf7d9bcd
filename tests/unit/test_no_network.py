"""No network unless the user asked for a hub download: with every socket connect refused, local work runs."""

from __future__ import annotations

import socket

import pytest

from vitscope.data.synthetic.write import synthesize
from vitscope.models.errors import ModelLoadError
from vitscope.workflows.analyze import analyze


@pytest.fixture()
def no_network(monkeypatch):
    attempts: list[object] = []

    def refuse(self, address, *args, **kwargs):
        attempts.append(address)
        raise OSError("network is blocked in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", lambda address, *a, **k: refuse(None, address))
    return attempts


def test_analysing_local_models_and_data_opens_no_connection(no_network, tmp_path) -> None:
    coco = synthesize(tmp_path / "coco", "coco", n=4, size=64, seed=1)
    results = analyze("tiny-vit-sup", f"{coco}::coco", ["attention_stats", "cka"], out=tmp_path / "out",
                      batch_size=2, device="cpu", progress=False)
    assert results.num_images == 4 and (tmp_path / "out" / "report.html").exists()
    assert no_network == []


def test_a_hub_id_is_the_only_thing_that_tries_and_fails_in_one_line(no_network, monkeypatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    from vitscope.models.load import load_model

    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache and the hub cannot be reached"):
        load_model("hf:acme/never-downloaded")
    assert len(no_network) == 1  # one quick probe of the hub, asked for by the hf: id
