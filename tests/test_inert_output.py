"""Text from a trace file never reaches a terminal, a report or a spreadsheet raw:
control characters are escaped in every format, a long source line shared by every
step is cut (the report stays linear in the trace), and CSV cells a spreadsheet would
evaluate start with ``'`` while numbers stay numbers."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from golden.handmade import handmade_trace
from test_trace_file import rewrite

import tracing
from app.cli import main
from tracing.analysis import report
from tracing.safe_text import csv_cell, cut, inert, inert_document

RAW = ("\x1b", "\r", "\x07", "\x9b", "\u202e", "\x00")
LONG = "y = " + "\x1b[2J" * 10 + "z" * 200_000


def _hostile(m: dict) -> None:
    sources = m["sources"]
    sources[0][2] = LONG
    m["sources"] = sources
    fields = m["steps"]["fields"]
    for row in m["steps"]["rows"]:
        row[fields.index("source")] = 0  # every step shares the long line
    ops = [r for r in m["steps"]["rows"] if r[fields.index("kind")] == "op"]
    ops[0][fields.index("op")] = '=HYPERLINK("http://x")\x1b]0;pwned\x07'
    ops[1][fields.index("op")] = "@SUM(A1)\u202e\r"
    ops[1][fields.index("error")] = "\x1b[31mboom\rhidden\x9b"
    m["meta"]["text"] = "\x1b]0;title\x07\rhi"
    m["error"] = "-2+3\x1b[2K"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("inert") / "hostile.sft"
    handmade_trace().save(path)
    rewrite(path, _hostile)
    return path


@pytest.mark.parametrize("fmt", ["md", "csv", "json", "html", "graphml"])
def test_every_report_format_is_inert_and_bounded(hostile, fmt):
    text = report.render(tracing.load(hostile), fmt)
    for raw in RAW:
        assert raw not in text, (fmt, raw)
    assert len(text) < 60_000, len(text)  # 12 steps share a 200 kB line: cut, not copied
    if fmt == "json":
        doc = json.loads(text)  # the text is inert, the data exact: JSON's own escapes
        assert doc["meta"]["text"] == "\x1b]0;title\x07\rhi"
    if fmt in ("md", "csv", "html", "json"):
        assert "more characters cut]" in text


def test_csv_cells_are_not_formulas_and_numbers_stay_numbers(hostile):
    rows = list(csv.reader(io.StringIO(report.render(tracing.load(hostile), "csv"))))
    header, body = rows[0], rows[1:]
    for row in body:
        for cell in row:
            assert not cell.startswith(("=", "+", "@", "\t", "\r")), cell
            if cell.startswith("-"):
                float(cell)  # a negative number, not a formula
    ops = [row[header.index("op")] for row in body if row[header.index("kind")] == "op"]
    assert any(op.startswith("'=HYPERLINK") for op in ops)
    assert any(op.startswith("'@SUM") for op in ops)
    mins = [row[header.index("min")] for row in body if row[header.index("min")]]
    assert any(float(x) < 0 for x in mins)


def test_terminal_output_of_report_and_diff_is_inert(hostile, capsys):
    assert main(["report", str(hostile)]) == 0
    assert main(["diff", str(hostile), str(hostile)]) == 0
    out = capsys.readouterr().out
    for raw in RAW:
        assert raw not in out


def test_an_error_line_quoting_a_file_is_inert(tmp_path, capsys):
    bad = tmp_path / "bad\x1b[2J.sft"
    bad.write_bytes(b"\x1b]0;x\x07 not a trace")
    assert main(["report", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error:")
    assert "\x1b" not in err and "\x07" not in err


def test_the_escaping_helpers():
    assert inert("a\x1b[2J\nb\u202e") == "a\\x1b[2J\\x0ab\\u202e"
    assert inert_document("a\nb\tc\x1b", json=True) == "a\nb\tc\\u001b"
    assert json.loads(inert_document('"\x9b"', json=True)) == "\x9b"  # still valid JSON
    assert cut("x" * 10, 4) == "xxxx… [6 more characters cut]"
    assert [csv_cell(v) for v in ("=1+1", "-1.5", "+3", "-", "@a", 7, "plain")] == [
        "'=1+1",
        "-1.5",
        "+3",
        "'-",
        "'@a",
        7,
        "plain",
    ]
