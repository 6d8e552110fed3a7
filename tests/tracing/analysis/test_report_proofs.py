"""The shape report with proofs (``report.render(..., proofs=True)``, ``report --proofs``):
each axis's proof as the trace recorded it (``TensorRecord.why`` in words, by
``tracing.dim_legend.proof_text``), ``not proven`` for a ``?`` axis, the letters with the
passes that moved them, the same in every format."""

from __future__ import annotations

import csv
import io
import json
import re
from collections import Counter

import networkx as nx
import pytest
import torch
from helpers.golden.handmade import handmade_trace
from helpers.tiny_models import tiny_model

import tracing
from tracing.analysis import report
from tracing.dim_legend import proof_text


@pytest.fixture(scope="module")
def ours():
    """Our model at its tiny size, traced on a (B=2, T=5) batch: every axis named."""
    return tracing.trace(tiny_model(), torch.randint(0, 50, (2, 5)), capture="shapes")


@pytest.fixture(scope="module")
def mlp():
    """A torch layer stack with no config: its hidden width 11 and feature width 7 are
    ``?`` (nothing proves a name), its weights have no names at all."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 11), torch.nn.ReLU(), torch.nn.Linear(11, 7))
    return tracing.trace(model, torch.randn(2, 5, 7), capture="shapes")


def recorded(trace, tid) -> Counter:
    """What the trace recorded for one tensor: (axis, proof in words) per axis."""
    r = trace.tensors[tid]
    out = Counter()
    for i, size in enumerate(r.shape):
        d = r.dims[i] if r.dims else "?"
        if d in ("", "?"):
            out[(f"?={size}", "not proven")] += 1
        else:
            out[(d, proof_text(r.why[i]))] += 1
    return out


def listed(text: str) -> dict[str, Counter]:
    """A proofs column read back: ``name: [B, T] words · [F] words; name2: ...``."""
    out = {}
    for tensor in filter(None, text.split("; ")):
        name, _, body = tensor.partition(": ")
        axes = Counter()
        for group in body.split(" · "):
            m = re.fullmatch(r"\[([^\]]*)\] (.+)", group)
            assert m, group
            for axis in m.group(1).split(", "):
                axes[(axis, m.group(2))] += 1
        out[name] = axes
    return out


def expected(trace, step) -> dict[str, Counter]:
    """The tensors a step row's proofs cover: its outputs, and the inputs no step made."""
    out = {}
    for tid, name in zip(step.inputs, step.input_names):
        if trace.tensors[tid].producer is None and trace.tensors[tid].shape:
            out[name] = recorded(trace, tid)
    for tid, name in zip(step.outputs, step.output_names):
        if trace.tensors[tid].shape:
            out[name] = recorded(trace, tid)
    return out


def md_column(text: str, section: str, column: str) -> list[str]:
    """One column of a Markdown table, unescaped (the cells hold no ``|``)."""
    part = text.split(f"## {section}\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    head = [c.strip() for c in part[0].strip("|").split(" | ")]
    at = head.index(column)
    return [line[2:-2].split(" | ")[at] for line in part[2:]]


def test_every_step_lists_the_proofs_the_trace_recorded(ours):
    steps = ours.steps
    assert all(r.why for r in ours.tensors if r.dims)  # the model's axes all have proofs
    md = md_column(report.render(ours, "md", proofs=True), "Steps", "proofs")
    rows = list(csv.DictReader(io.StringIO(report.render(ours, "csv", proofs=True))))
    csv_proofs = [r["proofs"] for r in rows if r["row"] == "step"]
    graph = nx.parse_graphml(report.render(ours, "graphml", proofs=True), node_type=int)
    assert len(md) == len(csv_proofs) == len(steps)
    for s, md_text, csv_text in zip(steps, md, csv_proofs):
        assert listed(md_text) == expected(ours, s), s.label
        assert csv_text == md_text.replace("\\|", "|")
        assert graph.nodes[s.index].get("proofs", "") == csv_text
    some = listed(md[[s.op for s in steps].index("linear")])
    assert some["output"][("B", "carried by linear from its input's axis")] == 1
    words = {text for s in steps for axes in listed_all(ours, s) for _, text in axes}
    assert "the first input's axes: B, then T" in words  # the input's B and T
    assert "its sizes in every pass, which no other name has" in words  # V, F: moved


def listed_all(trace, step):
    return expected(trace, step).values()


def test_json_gives_every_cell_its_codes_and_words(ours):
    doc = json.loads(report.render(ours, "json", proofs=True))
    assert doc["proofs"] is True and "second pass" in doc["evidence"]
    cells = [c for key in ("modules", "steps") for row in doc[key]
             for c in (*row["inputs"], *row["outputs"])]  # fmt: skip
    assert len(cells) > 100
    for c in cells:
        r = ours.tensors[c["id"]]
        assert c["why"] == (None if r.why is None else list(r.why))
        assert c["proofs"] == [proof_text(w) for w in r.why]
        assert "proven" not in c
    assert all("proven" not in row for row in doc["steps"])


def test_an_unproven_axis_says_so_in_every_format(mlp):
    linear = next(s for s in mlp.steps if s.op == "linear")
    weight = mlp.tensors[linear.inputs[1]]
    assert weight.dims is None and mlp.tensors[linear.outputs[0]].dims[2] == "?"
    md = report.render(mlp, "md", proofs=True)
    column = md_column(md, "Steps", "proofs")[linear.index]
    assert listed(column) == expected(mlp, linear)
    assert "0.weight: [?=11, ?=7] not proven" in column
    assert "output: [B, T] carried by linear from its input's axis · [?=11] not proven" in column
    rows = list(csv.DictReader(io.StringIO(report.render(mlp, "csv", proofs=True))))
    assert [r for r in rows if r["row"] == "step"][linear.index]["proofs"] == column
    page = report.render(mlp, "html", proofs=True)
    assert "0.weight: [?=11, ?=7] not proven<br>" in page
    doc = json.loads(report.render(mlp, "json", proofs=True))
    cells = doc["steps"][linear.index]["inputs"]
    assert cells[0]["proofs"] == ["the first input's axes: B, then T"] * 2 + ["not proven"]
    assert cells[0]["why"] == ["input", "input", ""]
    assert cells[1]["why"] is None and cells[1]["proofs"] == ["not proven"] * 2


def test_the_letters_list_their_size_origin_and_the_passes_that_moved_them(ours):
    table = ours.meta["dim_letters"]
    moved = {k: v.get("moved_by", []) for k, v in table.items()}
    assert moved["B"] == ["inputs"] and moved["C"] == []  # C: no pass moved it
    knob = next(k for k, v in moved.items() if v and v[0].startswith("config."))  # H here
    md = report.render(ours, "md", proofs=True)
    letters = [c.strip("`") for c in md_column(md, "Dims", "letter")]
    assert sorted(letters) == sorted(table)
    for letter, size, origin, by in zip(
        letters,
        md_column(md, "Dims", "size"),
        md_column(md, "Dims", "origin"),
        md_column(md, "Dims", "moved by"),
    ):
        assert int(size) == table[letter]["size"] and origin == table[letter]["origin"]
        assert by == ", ".join(moved[letter])
    assert "Axes that move with the inputs: proven by a second pass" in md
    doc = json.loads(report.render(ours, "json", proofs=True))
    assert {x["letter"]: x["moved_by"] for x in doc["letters"]} == moved
    rows = list(csv.DictReader(io.StringIO(report.render(ours, "csv", proofs=True))))
    letter_rows = {r["letter"]: r for r in rows if r["row"] == "letter"}
    assert {k: r["moved_by"] for k, r in letter_rows.items()} == {
        k: "; ".join(v) for k, v in moved.items()
    }
    assert letter_rows[knob]["size"] == str(table[knob]["size"])
    page = report.render(ours, "html", proofs=True)
    assert "<th>moved by</th>" in page and f"<td>{moved[knob][0]}</td></tr>" in page


@pytest.mark.parametrize("fmt", ["md", "csv", "json", "html", "graphml"])
def test_the_default_report_has_no_proofs(ours, fmt):
    text = report.render(ours, fmt)
    assert text == report.render(ours, fmt, proofs=False)
    assert "moved by" not in text and "carried by" not in text and "not proven" not in text
    assert not re.search(r"\| proofs \||,proofs,|<th>proofs|attr.name=.proofs", text)
    if fmt == "json":  # (the trace's meta, in the head, has the letters' moved_by)
        doc = json.loads(text)
        assert "proofs" not in doc and all("moved_by" not in x for x in doc["letters"])
        assert all("why" not in c for row in doc["steps"] for c in row["outputs"])


def test_a_trace_without_proofs_says_none_was_recorded():
    """A file from before proofs has dims but no ``why``: its named axes say so."""
    trace = handmade_trace()
    assert any(r.dims for r in trace.tensors) and not any(r.why for r in trace.tensors)
    md = report.render(trace, "md", proofs=True)
    assert "no proof recorded" in md and "carried by" not in md
    assert "Sizes only" in md  # no letter table either


def test_a_report_computed_without_proofs_cannot_render_them(ours):
    plain = report.compute(ours)
    with pytest.raises(ValueError, match="without proofs"):
        report.render(plain, "md", proofs=True)
    proven = report.compute(ours, proofs=True)
    assert report.render(proven, "md") == report.render(ours, "md", proofs=True)


def test_the_command_line_flag(ours, tmp_path, capsys):
    from app.cli import main

    path = tmp_path / "t.sft"
    ours.save(path)
    assert main(["report", str(path), "--proofs", "-o", str(tmp_path / "p.json")]) == 0
    doc = json.loads((tmp_path / "p.json").read_text(encoding="utf-8"))
    assert doc["proofs"] is True
    assert doc["steps"][0]["outputs"][0]["proofs"][0] == "carried by linear from its input's axis"
    capsys.readouterr()
    assert main(["report", str(path), "--proofs"]) == 0
    out = capsys.readouterr().out
    assert "| moved by |" in out and "[B, T] the first input's axes: B, then T" in out
    assert main(["report", str(path)]) == 0
    assert "moved by" not in capsys.readouterr().out
