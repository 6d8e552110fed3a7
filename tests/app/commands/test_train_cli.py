"""``scratchformer train`` / ``generate`` end to end (tiny, fast), and the progress bar."""

from __future__ import annotations

import io

import pytest
import torch

from app.cli import main
from app.core.progress import ProgressBar
from scratchformer import load_checkpoint, read_metadata

pytestmark = pytest.mark.usefixtures("one_thread")


TINY = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--d-ff", "32", "--batch-size", "8"]


def test_train_on_task_writes_a_loadable_checkpoint(tmp_path, capsys):
    out = tmp_path / "rev.safetensors"
    args = ["train", "--task", "reverse", "--steps", "12", "--eval-interval", "5"]
    rc = main([*args, "--checkpoint-interval", "5", "-o", str(out), *TINY])
    assert rc == 0
    captured = capsys.readouterr()
    assert "step 5: eval loss" in captured.out + captured.err
    assert "step 10: eval loss" in captured.out + captured.err
    assert "held-out exact match" in captured.out
    assert "100% |" in captured.err  # the progress bar reached the end (plain lines)
    assert "tok_s=" in captured.err and "loss=" in captured.err
    model = load_checkpoint(out)
    assert model.config.d_model == 16
    meta = read_metadata(out)["extra"]
    assert meta["task"] == "reverse" and meta["step"] == 12
    assert 0.0 <= meta["held_out_accuracy"] <= 1.0


def test_train_on_text_file(tmp_path, capsys):
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    out = tmp_path / "lm.safetensors"
    args = ["train", "--text", str(text), "--steps", "6", "--eval-interval", "3"]
    rc = main([*args, "--block-size", "16", "-o", str(out), "--quiet", *TINY])
    assert rc == 0
    assert "eval loss" in capsys.readouterr().out
    assert load_checkpoint(out).config.block_size == 16


def test_train_errors_are_one_line(tmp_path, capsys):
    rc = main(["train", "--text", str(tmp_path / "missing.txt"), "-o", str(tmp_path / "x")])
    assert rc == 2
    assert "error: no such text file" in capsys.readouterr().err
    rc = main(["train", "--task", "reverse", "--block-size", "16", "-o", str(tmp_path / "x")])
    assert rc == 2
    assert "needs block_size >= 34" in capsys.readouterr().err


@pytest.fixture
def checkpoint(tmp_path):
    out = tmp_path / "m.safetensors"
    main(["train", "--task", "copy", "--steps", "2", "-o", str(out), "--quiet", *TINY])
    return out


def test_generate_greedy_is_deterministic(checkpoint, capsys):
    args = ["generate", "--checkpoint", str(checkpoint), "--prompt", "abc|"]
    args += ["--temperature", "0", "--max-new-tokens", "5", "--stop", "\x00"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first and first.startswith("abc|")
    # and it is what the library's argmax decoding gives
    model = load_checkpoint(checkpoint)
    ids = model.generate(torch.tensor([list(b"abc|")]), 5, temperature=0, stop_token=0)
    assert first.rstrip("\n") == bytes(ids[0].tolist()).decode("utf-8", errors="replace")


def test_generate_seeded_sampling_is_reproducible(checkpoint, capsys):
    def run(seed):
        args = ["generate", "--checkpoint", str(checkpoint), "--prompt", "xy"]
        main([*args, "--max-new-tokens", "20", "--seed", str(seed), "--stop", "\x00"])
        return capsys.readouterr().out

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_generate_bad_checkpoint_is_one_line_error(tmp_path, capsys):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00" * 10)
    assert main(["generate", "--checkpoint", str(bad), "--prompt", "a"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(bad) in err and "Traceback" not in err


# --- progress bar


def test_progress_bar_plain_lines_when_not_a_tty():
    stream = io.StringIO()
    bar = ProgressBar(50, "work", stream=stream)
    for i in range(50):
        bar.update(1, loss=1.0 / (i + 1))
    bar.close()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert 5 <= len(lines) <= 11  # every 10%, not every update
    assert lines[-1].startswith("work 100% |") and "50/50" in lines[-1] and "loss=0.02" in lines[-1]


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_redraws_in_place_on_a_tty():
    stream = FakeTTY()
    with ProgressBar(4, "t", stream=stream, min_interval=0) as bar:
        bar.update(2, tok_s="1.0k")
        bar.write("step 2: eval loss 1.5")
        bar.update(2)
    text = stream.getvalue()
    assert text.count("\r") >= 3 and text.endswith("\n")
    assert "step 2: eval loss 1.5\n" in text
    assert "4/4" in text and "tok_s=1.0k" in text


def test_progress_bar_is_tqdm_so_other_tqdm_writes_step_around_it():
    from tqdm import tqdm

    stream = FakeTTY()
    with ProgressBar(10, "t", stream=stream, min_interval=0) as bar:
        bar.update(5)
        before = len(stream.getvalue())
        tqdm.write("from transformers", file=stream)  # another library's line
        after = stream.getvalue()[before:]
    assert after.index("from transformers\n") > after.index("\r")  # the bar cleared first
    assert after.rstrip("\n").rsplit("\r", 1)[-1].startswith("t  50% |")  # then redrawn


def test_train_saves_a_training_step_trace_of_step_n(tmp_path, capsys):
    import tracing

    out = tmp_path / "m.safetensors"
    args = ["train", "--task", "reverse", "--steps", "4", "--eval-interval", "4", "--quiet"]
    assert main([*args, "--trace-step", "3", "-o", str(out), *TINY]) == 0
    assert "wrote training-step trace" in capsys.readouterr().out
    trace = tracing.load(tmp_path / "m.step3.trace")
    assert trace.meta["watch"]["step"] == 3 and trace.backward_start is not None
    assert trace.param_grad("lm_head.weight") is not None or trace.meta["param_grads"]


def test_train_on_nonfinite_saves_the_step_that_went_bad(tmp_path, capsys):
    import math

    import tracing
    from tracing.breakpoints import first_nonfinite_gradient

    out = tmp_path / "m.safetensors"
    args = ["train", "--task", "reverse", "--steps", "8", "--eval-interval", "8", "--quiet"]
    # a learning rate this large sends the weights, then the loss, to Inf/NaN
    assert main([*args, "--lr", "1e30", "--warmup", "1", "--trace-on-nonfinite",
                 "-o", str(out), *TINY]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "wrote training-step trace" in printed and "non-finite gradient" in printed
    trace = tracing.load(tmp_path / "m.nonfinite.trace")
    step = trace.meta["watch"]["step"]
    assert step >= 2  # the first step starts from finite weights
    # it is the bad step itself: its forward started from finite weights, yet a
    # gradient (or the loss) is non-finite
    assert first_nonfinite_gradient(trace) is not None or not math.isfinite(trace.meta["loss"])
