"""WebDataset tar shards read where they are: brace patterns, samples keyed by basename with an image member and a
``cls`` or ``json`` label, nothing unpacked (an index of the tar headers, images read by offset), unreadable samples
skipped and named, and the commands reading them like any labelled set."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

import vitscope
from helpers.cli import analyze_and_probe, cli
from helpers.webdataset_shards import sample_image, write_shards
from vitscope.data import as_source
from vitscope.data.formats.errors import DatasetFormatError
from vitscope.data.webdataset import expand_braces


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("wds") / "shards")


def test_brace_patterns_expand_in_order_with_their_padding() -> None:
    assert expand_braces("s/{000008..000011}.tar") == [f"s/{i:06d}.tar" for i in range(8, 12)]
    assert expand_braces("a{1..2}-{0..1}.tar") == ["a1-0.tar", "a1-1.tar", "a2-0.tar", "a2-1.tar"]
    assert expand_braces("plain.tar") == ["plain.tar"]
    # bash's rule: a leading zero on either end pads to the longer end; "0" alone is no padding
    assert expand_braces("s/{0..0010}.tar")[:2] == ["s/0000.tar", "s/0001.tar"]
    assert expand_braces("s/{1..010}.tar")[-1] == "s/010.tar" and expand_braces("s/{1..010}.tar")[0] == "s/001.tar"
    assert expand_braces("s/{0..10}.tar")[:2] == ["s/0.tar", "s/1.tar"]


def test_samples_images_and_labels_by_position(shards) -> None:
    source = as_source(f"{shards}/{{000000..000002}}.tar::webdataset")
    assert len(source) == 18 and source.path(7) == "000001.tar/class1/img0007"
    assert source.load(7).tobytes() == Image.open(io.BytesIO(sample_image(7))).convert("RGB").tobytes()
    assert source.labels().tolist() == [i % 3 for i in range(18)]  # cls and json labels alike
    assert as_source(f"{shards}::webdataset").paths == source.paths  # a folder of shards: the same, sorted


def test_opening_reads_headers_only(shards, monkeypatch) -> None:
    from vitscope.data import webdataset

    reads = []
    monkeypatch.setattr(webdataset.os, "pread", lambda *a: reads.append(a) or b"")
    source = as_source(f"{shards}/{{000000..000002}}.tar::webdataset")
    assert reads == []  # the index is the tar headers
    assert source.fingerprint()["num_files"] == 3 and reads == []


def test_unreadable_samples_are_skipped_and_named(shards) -> None:
    results = vitscope.run(vitscope.load_model("tiny-vit"), f"{shards}/{{000000..000002}}.tar::webdataset",
                           ["attention_distance"], batch_size=4, progress=False)
    assert results.num_images == 16
    assert sorted(s.path for s in results.skipped) == ["000002.tar/class1/img0013", "000002.tar/class1/img0016"]


def test_a_missing_shard_is_named(shards) -> None:
    with pytest.raises(DatasetFormatError, match=r"1 of 4 WebDataset shards are missing, e.g. .*000003.tar"):
        as_source(f"{shards}/{{000000..000003}}.tar::webdataset")


def test_the_same_numbers_decoded_in_workers(shards) -> None:
    data = f"{shards}/{{000000..000002}}.tar::webdataset"
    backbone = vitscope.load_model("tiny-vit")
    one, two = (vitscope.run(backbone, data, ["knn_probe"], batch_size=4, progress=False, workers=w) for w in (0, 2))
    first, second = one["knn_probe"].tensors, two["knn_probe"].tensors
    assert first and all(np.array_equal(first[k], second[k]) for k in first)


def test_analyze_and_probe_read_shards(shards, tmp_path) -> None:
    doc, probe = analyze_and_probe(f"{shards}/{{000000..000002}}.tar::webdataset", tmp_path, "attention_distance")
    assert doc["num_images"] == 16 and doc["data"]["format"] == "webdataset" and len(doc["skipped"]) == 2
    assert any(k.startswith("knn") for k in probe["analyses"])


def test_compare_reads_shards(shards, tmp_path) -> None:
    data = f"{shards}/{{000000..000002}}.tar::webdataset"
    run = cli("compare", "--models", "tiny-vit,tiny-vit-p16", "-d", data, "-o", str(tmp_path), "-b", "4",
              "--no-resume")
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    assert set(doc["images_per_model"].values()) == {16} and doc["data"]["format"] == "webdataset"


def _tar(path, members: list[tuple[str, bytes]]) -> None:
    import tarfile

    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_keys_with_their_own_extension_and_hidden_members(tmp_path) -> None:
    """ImageNet's file names kept in the key (``n01440764_10026.JPEG.jpg``): the image and label are matched by the
    extension's last part; macOS's ``._*`` and ``__MACOSX/`` members are no samples."""
    (tmp_path / "s").mkdir()
    _tar(tmp_path / "s" / "000000.tar", [
        ("n01440764_10026.JPEG.jpg", sample_image(0)), ("n01440764_10026.JPEG.cls", b"7"),
        ("._n01440764_10026.JPEG.jpg", b"\x00\x05\x16\x07"), ("__MACOSX/x.jpg", b"junk"),
        ("n01440764_10027.JPEG.png", sample_image(1)), ("n01440764_10027.JPEG.json", b'{"label": 3}')])
    source = as_source(f"{tmp_path / 's'}::webdataset")
    assert source.paths == ["000000.tar/n01440764_10026", "000000.tar/n01440764_10027"]
    assert source.labels().tolist() == [7, 3]
    assert source.load(1).tobytes() == Image.open(io.BytesIO(sample_image(1))).convert("RGB").tobytes()


def test_a_shard_cut_short_is_refused_by_name(tmp_path) -> None:
    """A shard copied in part opens without error in tarfile (a cut between members reads as the end, a member cut
    inside is still indexed): refused, naming the shard, rather than read with samples missing."""
    whole = tmp_path / "whole.tar"
    _tar(whole, [(f"s{i:03d}.{ext}", sample_image(i) if ext == "png" else str(i).encode())
                 for i in range(6) for ext in ("png", "cls")])
    import tarfile

    data = whole.read_bytes()
    assert len(as_source(f"{whole}::webdataset")) == 6
    with tarfile.open(whole) as tar:
        members = tar.getmembers()
        end = tar.offset  # after the last member's data: the end-of-archive blocks follow
    last = members[-1]
    cuts = (members[6].offset,  # between two members: tarfile reads it as the end
            last.offset_data + last.size // 2,  # inside the last member's data: still indexed
            end)  # every member whole, the end-of-archive blocks gone
    for cut in cuts:
        (tmp_path / "cut").mkdir(exist_ok=True)
        (tmp_path / "cut" / "000000.tar").write_bytes(data[:cut])
        with pytest.raises(DatasetFormatError, match=r"000000.tar( is cut short|: unexpected end of data)"):
            as_source(f"{tmp_path / 'cut'}::webdataset")


def test_a_thousand_shards_keep_few_files_open(tmp_path, monkeypatch) -> None:
    """Reading every shard in turn keeps at most a few open (ImageNet's 1,024 shards would exceed the usual limit
    of open files); closing the source closes them."""
    import os

    from vitscope.data import webdataset

    (tmp_path / "many").mkdir()
    for s in range(20):
        _tar(tmp_path / "many" / f"{s:06d}.tar", [(f"k{s}.png", sample_image(s)), (f"k{s}.cls", b"1")])
    opened, closed = [], []
    real_open, real_close = os.open, os.close
    monkeypatch.setattr(webdataset.os, "open", lambda *a: opened.append(a[0]) or real_open(*a))
    monkeypatch.setattr(webdataset.os, "close", lambda fd: closed.append(fd) or real_close(fd))
    source = as_source(f"{tmp_path / 'many'}::webdataset")
    for i in range(len(source)):
        source.load(i)
    assert len(opened) == 20 and len(opened) - len(closed) == webdataset._OPEN_SHARDS
    source.close()
    assert len(opened) == len(closed)


def test_a_descending_brace_range_counts_down(tmp_path) -> None:
    """``{3..1}`` names 3, 2, 1 as bash does (it named none, and opening the pattern failed with an IndexError)."""
    assert expand_braces("d/{3..1}.tar") == ["d/3.tar", "d/2.tar", "d/1.tar"]
    assert expand_braces("d/{010..008}.tar") == ["d/010.tar", "d/009.tar", "d/008.tar"]
    assert expand_braces("d/{10..8}.tar") == ["d/10.tar", "d/9.tar", "d/8.tar"]
    for s in (1, 2, 3):
        _tar(tmp_path / f"{s}.tar", [(f"k{s}.png", sample_image(s)), (f"k{s}.cls", str(s).encode())])
    assert as_source(f"{tmp_path}/{{3..1}}.tar::webdataset").labels().tolist() == [3, 2, 1]


def test_the_member_with_the_image_extension_itself_is_the_image(tmp_path) -> None:
    """``x.seg.png`` (a mask) beside ``x.webp`` and ``y.thumb.jpg`` beside ``y.png`` are other members, not the image;
    the last part of an extension counts only when no member has an image extension itself."""
    mask, thumb = io.BytesIO(), io.BytesIO()
    Image.new("L", (10, 10)).save(mask, format="PNG")
    Image.new("RGB", (8, 8)).save(thumb, format="JPEG")
    photo = io.BytesIO()
    Image.open(io.BytesIO(sample_image(1))).save(photo, format="WEBP", lossless=True)
    _tar(tmp_path / "0.tar", [("x.webp", photo.getvalue()), ("x.seg.png", mask.getvalue()), ("x.cls", b"0"),
                              ("y.png", sample_image(2)), ("y.thumb.jpg", thumb.getvalue()), ("y.cls", b"1"),
                              ("z.JPEG.jpg", sample_image(3)), ("z.seg.png", mask.getvalue()), ("z.cls", b"1")])
    source = as_source(f"{tmp_path / '0.tar'}::webdataset")
    assert [source.load(i).size for i in range(2)] == [(26 + 1 % 4, 30), (26 + 2 % 4, 30)]
    assert source.load(2).size == (26 + 3 % 4, 30)  # no exact member: matched by the last part, jpg before png


def test_label_members_that_hold_no_integer_are_counted_in_one_warning(tmp_path) -> None:
    """``dog``, ``1.0`` and a ``json`` label that is a name leave their samples unlabelled, and labels() says how
    many (once); integers, in ``cls`` or ``json``, are read as before."""
    from vitscope.data.webdataset import UnreadableLabelWarning

    labels = [("cls", b"1"), ("cls", b"dog"), ("cls", b"1.0"), ("json", b'{"label": "fox"}'), ("json", b'{"label": 2}'),
              ("json", b'{"caption": "no label"}'), ("cls", b"0")]
    _tar(tmp_path / "0.tar", [m for i, (kind, value) in enumerate(labels)
                              for m in ((f"s{i}.png", sample_image(i)), (f"s{i}.{kind}", value))])
    source = as_source(f"{tmp_path / '0.tar'}::webdataset")
    with pytest.warns(UnreadableLabelWarning, match=r"3 WebDataset sample\(s\) .*not an integer \(e.g. 0.tar/s1: "
                                                    r"'dog'\)"):
        assert source.labels().tolist() == [1, -1, -1, -1, 2, -1, 0]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert source.labels().tolist() == [1, -1, -1, -1, 2, -1, 0]  # warned once per source


def test_a_first_sample_without_a_label_leaves_the_data_labelled(tmp_path) -> None:
    """The first sample has no ``cls``: the source still gives ``label`` (its labels() lists the others'), so k-NN
    and probes are not refused as if the data had no labels."""
    from vitscope.analyses.data_checks import DataFacts

    _tar(tmp_path / "0.tar", [("u0.png", sample_image(0))] + [
        m for i in range(1, 9) for m in ((f"k{i}.png", sample_image(i)), (f"k{i}.cls", str(i % 2).encode()))])
    source = as_source(f"{tmp_path / '0.tar'}::webdataset")
    assert source.targets(0) == {} and "label" in source.target_keys()
    assert DataFacts(source).class_problem() is None


def test_closing_needs_no_module_globals_at_interpreter_exit(tmp_path, monkeypatch) -> None:
    """At interpreter exit the module's globals may be cleared before a source is collected: its finaliser still
    closes the shards it opened, without an 'Exception ignored' message."""
    import os

    from vitscope.data import webdataset

    _tar(tmp_path / "0.tar", [("a.png", sample_image(0)), ("a.cls", b"1")])
    source = as_source(f"{tmp_path / '0.tar'}::webdataset")
    source.load(0)
    (fd,) = source._fds.values()
    for name in ("os", "contextlib"):
        monkeypatch.setattr(webdataset, name, None)
    source.__del__()
    monkeypatch.undo()
    with pytest.raises(OSError):
        os.fstat(fd)
    source._fds = {}


def test_shards_given_as_plain_images_name_the_format(shards, tmp_path) -> None:
    """A shard or a folder of shards without ::webdataset read as one unreadable image, or as no images."""
    import re

    from vitscope.data.images import EmptyDatasetError

    with pytest.raises(ValueError, match=r"000000.tar is not an image but a tar archive: .*000000.tar::webdataset'"):
        as_source(str(shards / "000000.tar"))
    held = r"it holds .tar files \(000000.tar \.\.\. 000002.tar\): read them as WebDataset shards with --data "
    with pytest.raises(EmptyDatasetError, match=held + f"'{re.escape(str(shards))}::webdataset'"):
        as_source(str(shards))
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "dataset_info.json").write_text("{}")
    with pytest.raises(EmptyDatasetError, match="it holds a Hugging Face dataset: read it with --data "
                                                f"'{re.escape(str(tmp_path / 'hf'))}::hf'"):
        as_source(str(tmp_path / "hf"))
    with pytest.raises(EmptyDatasetError, match=r"any case\)$"):
        (tmp_path / "empty").mkdir()
        as_source(str(tmp_path / "empty"))  # nothing of another format: the message as before


def test_a_member_declaring_more_than_a_sample_holds_is_not_read(tmp_path) -> None:
    """A tar header may declare any size, which a sparse file holds in a few blocks: the read allocated it (20 GB
    asked by a 20 kB shard). A label member over 1 MiB, an image over 512 MiB, leaves its sample skipped and named."""
    import tarfile

    from vitscope.data.images import ImageLoadError

    with tarfile.open(tmp_path / "000000.tar", "w") as tar:
        for k, label in enumerate([b"1", b"2" * (2**20 + 1)]):
            for name, data in ((f"s{k}.png", sample_image(k)), (f"s{k}.cls", label)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    source = as_source(f"{tmp_path / '000000.tar'}::webdataset")
    assert source.targets(0) == {"label": 1}
    with pytest.raises(ImageLoadError, match=r"its member declares 1048577 bytes, more than the 1 MiB vitscope reads "
                                             r"for a label"):
        source.targets(1)
    assert source.labels().tolist() == [1, -1]
