"""``scratchformer trace``, ``report`` and ``bench``, run in-process through ``app.cli.main``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tracing
from app.cli import main
from scratchformer import ByteTokenizer, DecoderOnlyTransformer, ModelConfig, save_checkpoint
from scratchformer.demo import demo_checkpoint_path
from tracing.analysis import report

TINY = dict(vocab_size=256, block_size=16, d_model=16, n_heads=2, n_layers=1, d_ff=32)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> tuple[Path, DecoderOnlyTransformer]:
    torch.manual_seed(1)
    model = DecoderOnlyTransformer(ModelConfig(**TINY)).eval()
    path = tmp_path_factory.mktemp("ckpt") / "tiny.safetensors"
    save_checkpoint(model, path)
    return path, model


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_user_error(rc: int, err: str, *words: str) -> None:
    assert rc == 2
    lines = err.strip().splitlines()
    assert lines[-1].startswith("error: "), err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[-1], lines[-1]


# --------------------------------------------------------------------------- trace


def test_trace_a_checkpoint_keeps_tokens_text_and_the_real_output(
    tiny_checkpoint, tmp_path, capsys
):
    ckpt, model = tiny_checkpoint
    out = tmp_path / "t.sft"
    rc, stdout, _ = run_cli(
        capsys, "trace", "--checkpoint", ckpt, "--prompt", "héllo", "--capture", "values",
        "-o", out, "--quiet",
    )  # fmt: skip
    assert rc == 0
    assert f"wrote {out}" in stdout
    trace = tracing.load(out)
    ids = ByteTokenizer().encode("héllo")
    assert trace.meta["tokens"] == ids and len(ids) == 6  # é is two bytes
    assert trace.meta["text"] == "héllo"
    assert trace.meta["capture"] == "values"
    # the root step's output is the model's own logits for those tokens
    root = trace.steps[0]
    assert root.kind == "module" and root.module == ""
    with torch.no_grad():
        expected = model(torch.tensor([ids]))
    logits = trace.value(root.outputs[0])
    assert logits.shape == (1, 6, 256)
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)


def test_trace_a_preset_says_its_weights_are_random(tmp_path, capsys):
    out = tmp_path / "p.sft"
    rc, _, err = run_cli(capsys, "trace", "--preset", "demo", "--prompt", "abc", "-o", out)
    assert rc == 0
    assert "random weights" in err
    trace = tracing.load(out)
    assert trace.meta["preset"] == "demo" and trace.meta["source"] == "preset"
    assert trace.meta["capture"] == "stats"
    config = ModelConfig.preset("demo")
    attention = trace.attention_maps()
    assert len(attention) == config.n_layers
    for weights in attention.values():
        assert weights.shape == (1, config.n_heads, 3, 3)


def test_trace_values_in_float16(tiny_checkpoint, tmp_path, capsys):
    ckpt, _ = tiny_checkpoint
    out = tmp_path / "h.sft"
    rc, _, _ = run_cli(
        capsys, "trace", "--checkpoint", ckpt, "--prompt", "abcd", "--capture", "values",
        "--value-dtype", "float16", "-o", out, "--quiet",
    )  # fmt: skip
    assert rc == 0
    trace = tracing.load(out)
    floats = [trace.value(r.id) for r in trace.tensors if r.value_key and r.dtype == "float32"]
    assert floats and all(v.dtype == torch.float16 for v in floats)


def test_trace_the_demo_model_by_default(tmp_path, capsys):
    out = tmp_path / "d.sft"
    rc, _, err = run_cli(capsys, "trace", "-o", out, "--quiet")
    if demo_checkpoint_path().is_file():
        assert rc == 0
        assert tracing.load(out).meta["source"] == "demo"
    else:  # the bundled checkpoint is not built yet: a clear error, not a traceback
        assert_user_error(rc, err, "demo checkpoint")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--checkpoint", "{tmp}/missing.safetensors"], ["no such checkpoint"]),
        (["--preset", "gpt5"], ["unknown preset 'gpt5'", "demo"]),
        (["--preset", "demo", "--prompt", ""], ["prompt is empty"]),
        (["--preset", "demo", "--prompt", "x" * 65], ["65 tokens", "block_size is 64"]),
        (["--preset", "demo", "--value-dtype", "float16"], ["need --capture values"]),
    ],
)
def test_trace_bad_arguments_are_one_line_errors(tmp_path, capsys, args, words):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    rc, _, err = run_cli(capsys, "trace", *args, "-o", tmp_path / "x.sft")
    assert_user_error(rc, err, *words)
    assert not (tmp_path / "x.sft").exists()


def test_trace_unwritable_output_fails_before_tracing(tmp_path, capsys):
    rc, _, err = run_cli(capsys, "trace", "--preset", "demo", "-o", tmp_path / "no" / "x.sft")
    assert_user_error(rc, err, "does not exist")
    assert "random weights" not in err  # nothing was built
    rc, _, err = run_cli(capsys, "trace", "--preset", "demo", "-o", tmp_path)
    assert_user_error(rc, err, "is a folder")


def test_trace_a_failing_forward_saves_the_partial_trace(tmp_path, capsys, monkeypatch):
    from helpers.golden.handmade import handmade_trace

    partial = handmade_trace(with_values=False)
    partial.error = "RuntimeError: boom"

    def failing_trace(model, *args, **kwargs):
        raise tracing.TraceError("the forward pass raised RuntimeError: boom", partial)

    monkeypatch.setattr(tracing, "trace", failing_trace)
    out = tmp_path / "partial.sft"
    rc, _, err = run_cli(capsys, "trace", "--preset", "demo", "-o", out, "--quiet")
    assert rc == 1
    assert "RuntimeError: boom" in err and "partial trace was saved" in err
    assert tracing.load(out).error == "RuntimeError: boom"


# --------------------------------------------------------------------------- report


@pytest.fixture
def trace_file(tiny_checkpoint, tmp_path, capsys) -> Path:
    ckpt, _ = tiny_checkpoint
    out = tmp_path / "r.sft"
    assert (
        main(["trace", "--checkpoint", str(ckpt), "--prompt", "hey", "-o", str(out), "--quiet"])
        == 0
    )
    capsys.readouterr()
    return out


def test_report_to_stdout_is_the_library_report(trace_file, capsys):
    rc, out, _ = run_cli(capsys, "report", trace_file)
    assert rc == 0
    assert out == report.render(tracing.load(trace_file), "md")
    rc, out, _ = run_cli(capsys, "report", trace_file, "--format", "json")
    doc = json.loads(out)
    assert len(doc["steps"]) == len(tracing.load(trace_file).steps)


@pytest.mark.parametrize("fmt", ["md", "csv", "json", "html", "graphml"])
def test_report_every_format_to_a_file(trace_file, tmp_path, capsys, fmt):
    out = tmp_path / f"report.{fmt}"
    rc, _, err = run_cli(capsys, "report", trace_file, "--format", fmt, "-o", out)
    assert rc == 0 and f"wrote {out}" in err
    assert out.read_text(encoding="utf-8") == report.render(tracing.load(trace_file), fmt)


def test_report_format_from_suffix_and_its_errors(trace_file, tmp_path, capsys):
    rc, _, _ = run_cli(capsys, "report", trace_file, "-o", tmp_path / "r.csv")
    assert rc == 0 and (tmp_path / "r.csv").read_text().startswith("row,step")
    rc, _, err = run_cli(capsys, "report", trace_file, "-o", tmp_path / "r.txt")
    assert_user_error(rc, err, "--format")
    rc, _, err = run_cli(capsys, "report", tmp_path / "nothing.sft")
    assert_user_error(rc, err, "no such file")
    broken = tmp_path / "broken.sft"
    broken.write_bytes(trace_file.read_bytes()[:-5])
    rc, _, err = run_cli(capsys, "report", broken)
    assert_user_error(rc, err, "truncated", str(broken))


# --------------------------------------------------------------------------- installed entry point


@pytest.mark.slow
def test_installed_entry_point_traces_and_reports(tmp_path):
    exe = shutil.which("scratchformer", path=str(Path(sys.executable).parent))
    assert exe, "the scratchformer entry point is not installed next to this Python"
    out = tmp_path / "s.sft"
    done = subprocess.run(
        [exe, "trace", "--preset", "demo", "--prompt", "hi", "-o", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    done = subprocess.run(
        [exe, "report", str(out), "--format", "csv"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("row,step,kind")


# --------------------------------------------------------------------------- bench


@pytest.mark.slow
def test_bench_quick_prints_every_figure_with_its_target(capsys):
    rc, out, _ = run_cli(capsys, "bench", "--quick", "--repeat", "1")
    assert rc == 0
    for level in ("shapes", "stats", "values"):
        assert sum(line.startswith(f"  {level} ") for line in out.splitlines()) == 2
    for figure in ("save", "load", "open", "memory"):
        assert any(line.startswith(f"  {figure} ") for line in out.splitlines()), figure
    assert "target <= 2x" in out  # demo shapes
    assert "target >= 0.5x" in out  # save throughput
    assert "target <= 0.5 s" in out  # lazy open
    assert "target <= 1.2x" in out  # memory
    for figure in ("trace_step shapes", "trace_step stats", "trace_step values", "watched loop"):
        assert f"  {figure}" in out, figure  # the training-step section
    assert "peak memory of a training step: not with --quick" in out


def test_training_step_memory_child_reports_its_peak(tmp_path):
    """One child measurement of the training-step memory benchmark, run in-process."""
    from app.commands.bench_training import memory_child

    spec = {"preset": "nano", "tokens": 8, "threads": 1, "mode": "streamed"}
    fig = memory_child(spec | {"file": str(tmp_path / "s.sft")})
    assert fig["peak_rss"] > 0 and fig["values"] > 0 and fig["file_bytes"] > 0


def test_bench_takes_your_own_model(capsys):
    """``bench --model``: the capture overhead and naming cost on a model brought by file."""
    tutorial = Path(__file__).resolve().parents[2] / "helpers" / "models" / "tutorial_fixed.py"
    rc, out, _ = run_cli(
        capsys, "bench", "--model", f"{tutorial}:TutorialLM", "--input-shape", "1,8",
        "--quick", "--repeat", "1",
    )  # fmt: skip
    assert rc == 0
    assert "TutorialLM: plain forward" in out
    for level in ("shapes", "stats", "values"):
        assert sum(line.startswith(f"  {level} ") for line in out.splitlines()) == 1
    assert "  naming  capture" in out
