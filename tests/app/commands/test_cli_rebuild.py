"""``scratchformer trace --model FILE.py:Class``: a class built with no arguments is rebuilt
from its defaults for the knob passes (``tracing.Constructor.of_defaults``), so its sizes'
letters come from its constructor's arguments (issue 31, item 3)."""

from __future__ import annotations

from pathlib import Path

import tracing


def test_scratchformer_trace_rebuilds_a_model_file_from_its_defaults(tmp_path, capsys):
    from app.cli import main

    tutorial = Path(__file__).parents[2] / "helpers" / "models" / "tutorial_fixed.py"
    out = tmp_path / "t.sft"
    argv = ["trace", "--model", f"{tutorial}:TutorialLM", "--input-shape", "2,10", "-o", str(out)]
    assert main([*argv, "--capture", "shapes", "--quiet"]) == 0
    trace = tracing.load(out)
    letters = trace.meta["dim_letters"]
    assert letters["C"]["origin"] == "config.d_model"
    assert letters["V"]["origin"] == "config.vocab_size"
