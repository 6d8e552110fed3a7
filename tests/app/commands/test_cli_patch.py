"""``scratchformer patch``: the sweep as CSV and a PNG heatmap, errors as one line."""

from __future__ import annotations

import struct

import pytest

from app.cli import main


def test_patch_writes_csv_and_png(tmp_path, capsys):
    csv, png = tmp_path / "heads.csv", tmp_path / "heads.png"
    args = ["patch", "--clean", "wordplay|yalp", "--corrupted", "workplay|yalp"]
    assert main([*args, "-o", str(csv), "--png", str(png), "--quiet"]) == 0
    lines = csv.read_text().splitlines()
    assert lines[0] == "heads,head 0,head 1,head 2,head 3"
    assert [line.split(",")[0] for line in lines[1:]] == ["layer 0", "layer 1"]
    assert all(len(line.split(",")) == 5 for line in lines)
    out = capsys.readouterr().out
    assert "logit['d'] - logit['k']" in out and "largest: layer 1 head 2" in out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 300 and height > 200


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--clean", "abc", "--corrupted", "abcd"], "same length"),
        (["--clean", "abc", "--corrupted", "abd", "--site", "blocks.9"], "no module 'blocks.9'"),
    ],
)
def test_patch_errors_are_one_line(tmp_path, capsys, extra, message):
    assert main(["patch", *extra, "-o", str(tmp_path / "x.csv"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err
    assert not (tmp_path / "x.csv").exists()
