"""Every causal-LM architecture of the installed ``transformers``, tiny, named in full
(``benchmarks/bench_dims_architectures.py``): slow, so only with
``SCRATCHFORMER_ALL_ARCHS=1``; the suite's own cases are in ``test_dims_evidence.py``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytestmark = [
    pytest.mark.skipif(
        os.environ.get("SCRATCHFORMER_ALL_ARCHS") != "1", reason="SCRATCHFORMER_ALL_ARCHS=1"
    ),
    pytest.mark.usefixtures("one_thread"),
]
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))


def test_every_architecture_meets_the_dims_targets():
    import bench_dims_architectures as survey

    rows = [survey.survey_one(name) for name in survey.architectures()]
    figures = survey.summary(rows)
    print(figures)
    wrong = {r["model"]: r["wrong_examples"] for r in rows if r.get("wrong")}
    assert wrong == {}  # never a wrong letter
    assert [r["model"] for r in rows if "error" in r] == []  # a trace never fails
    assert figures["median_named"] >= 98
    low = {r["model"]: r["named"] for r in rows if r.get("named", 100) < 90}
    assert low == {}
    differ = {r["model"]: r["maps"] for r in rows if r.get("maps", "-").startswith("≠")}
    assert differ == {}
