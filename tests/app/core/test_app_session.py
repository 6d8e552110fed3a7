"""app.core.session: loading, tracing, and the debugger's stepping rules (no Qt needed)."""

from __future__ import annotations

import threading

import pytest
import torch
from helpers.app_fixtures import tiny_trace

import tracing
from app.core import session
from app.core.session import ModelSource, SessionError, TraceRequest


@pytest.fixture(scope="module")
def trace():
    return tiny_trace(inf_at="blocks.1.ff.act")


# --------------------------------------------------------------------------- stepping


def test_status_text_names_step_module_and_op(trace):
    step = next(s for s in trace.steps if s.op == "matmul")
    text = session.status_text(trace, step.index)
    assert text == f"step {step.index + 1} / {len(trace.steps)} · {step.module} · matmul"


def test_step_over_skips_a_module_call_and_moves_one_step_on_an_op(trace):
    block = next(s for s in trace.steps if s.module == "blocks.0" and s.kind == "module")
    assert session.step_over(trace, block.index) == block.end + 1
    assert trace.steps[block.end + 1].module == "blocks.1"
    op = next(s for s in trace.steps if s.kind == "op")
    assert session.step_over(trace, op.index) == op.index + 1


def test_step_out_goes_past_the_enclosing_module(trace):
    inner = next(s for s in trace.steps if s.module == "blocks.0.attn.sdpa" and s.op == "softmax")
    parent = trace.steps[inner.parent]
    assert parent.module == "blocks.0.attn.sdpa"
    target = session.step_out(trace, inner.index)
    assert target == parent.end + 1
    # from the top-level call, stepping out ends at the last step
    assert session.step_out(trace, 0) == len(trace.steps) - 1


def test_next_nonfinite_finds_the_planted_inf(trace):
    planted = next(s for s in trace.steps if s.module == "blocks.1.ff.act" and s.kind == "op")
    assert trace.tensors[planted.outputs[0]].stats.inf == 1
    first = session.next_nonfinite(trace, 0)
    assert first is not None and first <= planted.index
    assert session.step_has_nonfinite(trace, first)
    assert not any(session.step_has_nonfinite(trace, j) for j in range(first))
    # a clean trace has none
    assert session.next_nonfinite(tiny_trace(), 0) is None


def test_first_steps_by_module_and_failing_step(trace):
    first = session.first_steps_by_module(trace)
    assert first[""] == 0
    assert trace.steps[first["blocks.1.attn"]].op == "MultiHeadAttention"
    assert session.failing_step(trace) == len(trace.steps) - 1  # nothing raised


# --------------------------------------------------------------------------- files


def test_open_trace_reports_missing_corrupt_and_foreign_files(tmp_path):
    with pytest.raises(SessionError, match="No such file"):
        session.open_trace(tmp_path / "nope.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(SessionError, match=r"bad\.safetensors"):
        session.open_trace(bad)
    from safetensors.torch import save_file

    foreign = tmp_path / "weights.safetensors"
    save_file({"w": torch.zeros(2)}, str(foreign))
    with pytest.raises(SessionError, match=r"weights\.safetensors"):
        session.open_trace(foreign)


def test_open_trace_round_trips_a_saved_trace(tmp_path):
    path = tmp_path / "t.safetensors"
    trace = tiny_trace()
    trace.save(path)
    loaded = session.open_trace(path)
    assert [s.op for s in loaded.steps] == [s.op for s in trace.steps]


# --------------------------------------------------------------------------- tracing


def _demo_preset(prompt="hello", capture="shapes"):
    return TraceRequest(prompt, ModelSource("preset", preset="demo"), capture)


def test_run_trace_reports_progress_and_completes():
    seen = []
    outcome = session.run_trace(_demo_preset(), progress=lambda d, t: seen.append((d, t)))
    assert outcome.status == "complete" and outcome.trace is not None
    assert outcome.trace.meta["tokens"] == list(b"hello")
    assert seen and seen[-1][0] == seen[-1][1]  # ends at 100 %
    assert all(d <= t for d, t in seen)


def test_run_trace_can_be_cancelled():
    cancel = threading.Event()
    cancel.set()
    outcome = session.run_trace(_demo_preset(), cancel=cancel)
    assert outcome.status == "cancelled"
    # the global hook is gone: a later forward runs normally
    assert session.run_trace(_demo_preset()).status == "complete"


def test_bad_requests_name_the_problem(tmp_path):
    with pytest.raises(SessionError, match="at most 64"):
        session.run_trace(_demo_preset(prompt="x" * 65))
    with pytest.raises(SessionError, match="empty"):
        session.run_trace(_demo_preset(prompt=""))
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(SessionError, match=r"junk\.safetensors"):
        session.run_trace(TraceRequest("hi", ModelSource("checkpoint", checkpoint=str(junk))))
    with pytest.raises(SessionError, match="not found"):
        session.run_trace(TraceRequest("hi", ModelSource("checkpoint", checkpoint="/no/such")))


def test_a_forward_that_raises_gives_the_partial_trace(monkeypatch):
    model, tokenizer = session.build_model(ModelSource("preset", preset="demo"))

    def explode(module, args, output):
        raise ValueError("boom in block 1")

    model.blocks[1].register_forward_hook(explode)
    monkeypatch.setattr(session, "build_model", lambda source: (model, tokenizer))
    outcome = session.run_trace(_demo_preset())
    assert outcome.status == "failed"
    assert "boom in block 1" in outcome.message
    assert outcome.trace is not None and not outcome.trace.complete
    failing = outcome.trace.steps[outcome.start_step]
    assert failing.error is not None
    assert isinstance(outcome.trace, tracing.Trace)
