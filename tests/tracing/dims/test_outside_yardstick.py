"""The yardstick of ``benchmarks/bench_dims_outside.py`` on hand-written names: a measure
the namer is judged by must itself read a name as the size it claims, and call a name
wrong only when it is."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from bench_dims_outside import Run, figures, fits

LM = {"B": 3, "T": 11, "C": 96, "H": 6, "KV": 2, "D": 16, "F": 200, "V": 101}


def test_a_name_is_read_as_the_size_it_claims():
    assert fits("B·T", 33, LM, {})
    assert fits("KV·D", 32, LM, {})
    assert fits("(H+2KV)·D", 160, LM, {})
    assert fits("3C", 288, LM, {})
    assert fits("D/2", 8, LM, {})
    assert fits("1+D", 17, LM, {})
    assert fits("H/KV", 3, LM, {})
    assert fits("1", 1, LM, {}) and fits("3", 3, LM, {})
    assert fits("4·hidden_size", 160, {"hidden_size": 40}, {})
    assert fits("config.patch_size", 4, {"patch_size": 4}, {})
    assert not fits("D", 8, LM, {}) and not fits("2H", 16, LM, {})


def test_unnamed_is_never_wrong_and_what_cannot_be_read_is_unchecked():
    assert fits("?", 7, LM, {}) is True
    assert fits("Q[:i]", 5, LM, {"Q": 36}) is None  # a slice
    assert fits("Zq", 5, LM, {}) is None  # a letter with no known size
    assert fits("Zq", 5, LM, {"Zq": 5}) is True  # the trace's own size where truth is silent


def test_a_letter_the_model_has_no_such_thing_for_is_wrong():
    recurrent = {"B": 3, "T": 11, "V": 50, "C": {24, 40}, "hidden_size": 40}
    assert fits("D", 40, recurrent, {"D": 40}) is False  # no heads, whatever the trace says
    assert fits("C", 40, recurrent, {"C": 40}) and not fits("C", 24, recurrent, {"C": 40})


def test_a_letter_the_trace_sizes_wrongly_is_checked_against_the_truth():
    vit = {"B": 2, "T": {49, 50}}
    assert fits("T", 3, vit, {"T": 3}) is False  # colour channels read T (T = 3 by position)
    assert fits("T", 50, vit, {"T": 50}) and not fits("T", 49, vit, {"T": 50})


def run(dims, shape, truth, own=None):
    return Run(keys=[("", "op", 1, 1)], tensors=[(shape, dims)], truth=truth, own=own or {},
               maps=0, seconds=0.0)  # fmt: skip


def test_a_name_that_holds_only_at_one_size_is_wrong_and_changed():
    distinct = run(("B", "?"), (2, 49), {"B": 2, "D": 10})
    same = run(("B", "D"), (2, 16), {"B": 2, "D": 16})  # 16 patches == head width 16
    f = figures(same, distinct)
    assert f.named == 100.0
    assert f.changed == ["#0[1] ?=49 -> D=16"]
    assert len(f.wrong) == 1 and "not at the distinct sizes" in f.wrong[0]
    assert figures(distinct).wrong == [] and figures(distinct).named == 50.0


def test_a_name_kept_at_both_sizes_is_right():
    distinct = run(("B", "Np"), (2, 49), {"B": 2}, {"Np": 49})
    same = run(("B", "Np"), (2, 16), {"B": 2}, {"Np": 16})
    f = figures(same, distinct)
    assert (f.wrong, f.changed, f.unchecked) == ([], [], 0)
