"""Seeded fuzzing of trace files: no mutated file may end in anything but a clean
``TraceFileError`` or a trace every consumer can use (see ``tests/helpers/fuzz_traces.py``).

The suite runs ``SCRATCHFORMER_FUZZ_CASES`` cases (default 200, ~30 s); set it higher for
a longer run, e.g. ``SCRATCHFORMER_FUZZ_CASES=5000``. The driver runs in a fresh
interpreter (no QApplication may exist before it forks), each case in its own child with
memory and time limits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.fuzz_traces import CASES_VARIABLE

DEFAULT_CASES = 15  # more with SCRATCHFORMER_FUZZ_CASES (the seeded run in CI stays quick)


@pytest.mark.slow
def test_mutated_trace_files_load_cleanly_or_fail_cleanly(tmp_path):
    cases = int(os.environ.get(CASES_VARIABLE, DEFAULT_CASES))
    seed = int(os.environ.get("SCRATCHFORMER_FUZZ_SEED", 0))
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root), "QT_QPA_PLATFORM": "offscreen"}
    result = subprocess.run(
        [sys.executable, str(root / "tests" / "helpers" / "fuzz_traces.py"), "--cases", str(cases),
         "--seed", str(seed), "--app-cases", "8", "--json"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60 + 2 * cases,
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    counts = outcome["counts"]
    report = "\n".join(
        f"case {f['case']} ({f['seed']}, {f['mutation']}): {f['message']}\n{f.get('traceback', '')}"
        for f in outcome["failures"]
    )
    assert not outcome["failures"], report
    assert counts["cases"] == cases
    assert counts.get("error", 0) + counts.get("loaded", 0) == cases
    # the mutations reach both sides: files refused, and files that load and are used
    assert counts.get("error", 0) > cases // 10 and counts.get("loaded", 0) > cases // 20
    assert counts.get("app", 0) > 0
