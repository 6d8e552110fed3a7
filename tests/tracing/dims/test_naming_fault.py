"""A fault inside naming costs the names, never the trace (issue 31: nothing recorded is lost).

The suite sets ``SCRATCHFORMER_DIMS_STRICT`` so that such a fault fails the test that meets
it; a user's trace keeps its steps and tensors, with a warning and a note saying the names
were not computed.
"""

import pytest
import torch
import torch.nn as nn

import tracing
import tracing.dims.prove as prove


def test_a_fault_in_naming_keeps_the_trace_and_says_so(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a rule that raised")

    monkeypatch.delenv("SCRATCHFORMER_DIMS_STRICT", raising=False)
    monkeypatch.setattr(prove, "name_axes", broken)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    x = torch.randn(2, 6)
    with pytest.warns(RuntimeWarning, match="axis names not computed: RuntimeError"):
        trace = tracing.trace(model, x)
    assert [s.op for s in trace.steps if s.kind == "op"] == ["linear", "relu", "linear"]
    last = [s for s in trace.steps if s.kind == "op"][-1]
    assert trace.tensor(last.outputs[0]).shape == (2, 3)
    assert all(r.dims is None for r in trace.tensors)
    assert "axis names not computed: RuntimeError: a rule that raised" in trace.meta["notes"]
    assert trace.meta["dims_evidence"]["error"].endswith("a rule that raised")


def test_strict_mode_raises_the_fault(monkeypatch):
    monkeypatch.setenv("SCRATCHFORMER_DIMS_STRICT", "1")
    monkeypatch.setattr(prove, "name_axes", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        tracing.trace(nn.Linear(4, 2), torch.randn(3, 4))
