"""Shape reports: golden files for the text formats, and structural checks for every format.

Regenerate the golden files after an intended change with::

    SCRATCHFORMER_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_report.py

then read the diff (``git diff tests/helpers/golden``) before committing it.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path

import networkx as nx
import pytest
from helpers.golden.handmade import handmade_trace

import tracing
from tracing.analysis import report

GOLDEN = Path(__file__).resolve().parents[2] / "helpers" / "golden"
UPDATE = os.environ.get("SCRATCHFORMER_UPDATE_GOLDEN") == "1"


# --------------------------------------------------------------------------- golden files


@pytest.mark.parametrize("fmt", ["md", "csv", "json"])
def test_text_formats_match_their_golden_files(fmt):
    text = report.render(handmade_trace(), fmt)
    golden = GOLDEN / f"toy_report.{fmt}"
    if UPDATE:
        golden.write_text(text, encoding="utf-8", newline="")
    assert golden.exists(), f"missing {golden}; run with SCRATCHFORMER_UPDATE_GOLDEN=1"
    assert text == golden.read_text(encoding="utf-8"), f"{fmt} report differs from {golden}"


# --------------------------------------------------------------------------- content


def test_csv_has_a_row_per_module_and_per_step_with_the_recorded_shapes():
    trace = handmade_trace()
    rows = list(csv.DictReader(io.StringIO(report.render(trace, "csv"))))
    modules = [r for r in rows if r["row"] == "module"]
    steps = [r for r in rows if r["row"] == "step"]
    assert [r["module"] for r in modules] == list(trace.modules)
    assert len(steps) == len(trace.steps)
    for row, step in zip(steps, trace.steps):
        assert int(row["step"]) == step.index + 1  # the number the app's step bar shows
        assert row["op"] == step.op
        assert row["module"] == step.module
        for tid in step.outputs:
            assert trace.tensors[tid].shape_str() in row["outputs"]
        if step.source:
            assert row["source"] == f"{step.source.file}:{step.source.line}"
            assert row["code"] == step.source.text
    root = modules[0]
    assert int(root["params_total"]) == trace.modules[""].params_total
    assert int(root["calls"]) == 1
    assert modules[-1]["calls"] == "0"  # "unused" never ran


def test_json_is_strict_and_carries_shapes_dims_and_stats():
    trace = handmade_trace()

    def no_constants(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    doc = json.loads(report.render(trace, "json"), parse_constant=no_constants)
    assert len(doc["steps"]) == len(trace.steps)
    assert doc["schema"] == 2
    for row, step in zip(doc["steps"], trace.steps):
        assert row["step"] == step.index + 1 and row["op"] == step.op
        for cell, tid in zip(row["outputs"], step.outputs):
            rec = trace.tensors[tid]
            assert cell["shape"] == list(rec.shape)
            assert cell["dims"] == (None if rec.dims is None else list(rec.dims))
            assert cell["dtype"] == rec.dtype
        first = trace.tensors[step.outputs[0]]
        if first.stats is not None:
            assert row["stats"]["nan"] == first.stats.nan
            assert row["stats"]["inf"] == first.stats.inf
    # the attention step is tagged as such
    softmax = doc["steps"][7]
    assert softmax["outputs"][0]["role"] == "attention"
    assert softmax["outputs"][0]["dims"] == ["B", "H", "T", "T"]
    assert doc["summary"]["parameters"] == 49


def test_stats_of_a_tensor_with_nan_and_inf_are_reported_as_counts():
    text = report.render(handmade_trace(), "md")
    head_row = next(line for line in text.splitlines() if line.startswith("| 11 |"))
    assert "| 1/1 |" in head_row and "| linear |" in head_row  # step 11 is steps[10]


class _Collector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        self.text: list[str] = []
        self.stack: list[str] = []
        self.void = {"meta", "br", "link", "img", "input", "hr"}

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += attrs
        if tag not in self.void:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1:]}>"
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def test_html_is_self_contained_balanced_and_escaped():
    trace = handmade_trace()
    page = report.render(trace, "html")
    parser = _Collector()
    parser.feed(page)
    parser.close()
    assert parser.stack == []  # every element closed
    assert "style" in parser.tags
    assert not {"script", "link", "img", "iframe"} & set(parser.tags)
    assert not [v for k, v in parser.attrs if k in ("src", "href")]
    assert "http://" not in page and "https://" not in page
    text = "".join(parser.text)
    # user text comes back exactly once unescaped by the parser, never as markup
    assert "scale = 1 / D ** 0.5  # <C & D>" in text
    assert "<C & D>" not in page
    assert 'a<b & "c"' in text
    # one body row per step and per module
    assert page.count('<tr class="module') + page.count('<tr class="op') == len(trace.steps)
    assert page.count("<tr") == len(trace.steps) + len(trace.modules) + 2
    # the "#" cell of each step row is its number, 1-based as the app counts
    numbers = re.findall(r'<tr class="(?:module|op)[^"]*"[^>]*><td class=num>(\d+)</td>', page)
    assert [int(n) for n in numbers] == [s.index + 1 for s in trace.steps]


def test_graphml_has_a_node_per_step_and_data_flow_edges(tmp_path):
    trace = handmade_trace()
    path = report.write(trace, tmp_path / "g.graphml")
    g = nx.read_graphml(path)
    assert g.number_of_nodes() == len(trace.steps)
    # every consumer of a tensor made by an earlier step has an edge from that step
    for step in trace.steps:
        for tid in step.inputs:
            producer = trace.tensors[tid].producer
            if producer is not None and producer != step.index:
                assert g.has_edge(str(producer), str(step.index))


def test_failed_forward_is_flagged():
    trace = handmade_trace(with_values=False)
    trace.error = "RuntimeError: shapes cannot be multiplied"
    last = trace.steps[-1]
    trace.steps[-1] = type(last)(**{**last.__dict__, "error": trace.error})
    md = report.render(trace, "md")
    assert "The forward pass raised:** RuntimeError: shapes cannot be multiplied" in md
    assert "new_zeros ⚠" in md
    page = report.render(trace, "html")
    assert 'class="op error"' in page


def test_report_of_a_loaded_trace_equals_report_of_the_original(tmp_path):
    trace = handmade_trace()
    trace.save(tmp_path / "t.sft")
    loaded = tracing.load(tmp_path / "t.sft")
    for fmt in ("md", "csv", "json", "html"):
        assert report.render(loaded, fmt) == report.render(trace, fmt)


# --------------------------------------------------------------------------- write / formats


@pytest.mark.parametrize(
    ("name", "fmt"),
    [("r.md", "md"), ("r.CSV", "csv"), ("r.json", "json"), ("r.htm", "html")],
)
def test_write_takes_the_format_from_the_suffix(tmp_path, name, fmt):
    trace = handmade_trace()
    path = report.write(trace, tmp_path / name)
    assert path.read_text(encoding="utf-8") == report.render(trace, fmt)


def test_write_with_an_explicit_format_and_bad_formats(tmp_path):
    trace = handmade_trace()
    report.write(trace, tmp_path / "report.txt", fmt="csv")
    assert (tmp_path / "report.txt").read_text().startswith("row,step,kind")
    with pytest.raises(ValueError, match="cannot tell the report format"):
        report.write(trace, tmp_path / "report.txt")
    with pytest.raises(ValueError, match="unknown report format 'pdf'"):
        report.render(trace, "pdf")


def test_short_path_is_machine_independent(tmp_path, monkeypatch):
    assert report.short_path("/x/lib/python3.11/site-packages/torch/nn/functional.py") == (
        "torch/nn/functional.py"
    )
    monkeypatch.chdir(tmp_path)
    assert report.short_path(str(tmp_path / "pkg" / "model.py")) == "pkg/model.py"
    assert report.short_path("/elsewhere/model.py") == "/elsewhere/model.py"
    assert report.short_path("<stdin>") == "<stdin>"


def test_the_report_carries_the_traces_letter_table():
    """md, html and json list each letter with its size, origin and meaning; a trace without
    the table says sizes only (the golden files show that case)."""
    trace = handmade_trace()
    trace.meta["dim_letters"] = {
        "T": {"size": 3, "origin": "input: the first input's axis 1", "meaning": "time"},
        "KV": {"size": 2, "origin": "config.num_key_value_heads", "meaning": "key/value heads"},
        "B": {"size": 1, "origin": "input: the first input's axis 0", "meaning": "batch"},
    }
    md = report.render(trace, "md")
    assert "## Dims" in md and "Sizes only" not in md
    assert "| `KV` | 2 | config.num_key_value_heads | key/value heads |" in md
    assert md.index("| `B` |") < md.index("| `T` |") < md.index("| `KV` |")  # usual order
    page = report.render(trace, "html")
    assert "<h2>Dims</h2>" in page and "<td>config.num_key_value_heads</td>" in page
    letters = json.loads(report.render(trace, "json"))["letters"]
    assert [x["letter"] for x in letters] == ["B", "T", "KV"]
    assert letters[2] == {
        "letter": "KV",
        "size": 2,
        "origin": "config.num_key_value_heads",
        "meaning": "key/value heads",
    }
    assert "Sizes only" in report.render(handmade_trace(), "md")
