"""Bad command lines: each ends in exactly one ``error:`` line on stderr and exit status 2,
before any long work, creating nothing. (Table-driven; the commands run in-process.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.golden.handmade import handmade_trace

from app.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("cli")
    good = root / "good.sft"
    handmade_trace().save(good)
    corrupt = root / "corrupt.sft"
    corrupt.write_bytes(good.read_bytes()[:100])
    fifo = root / "pipe"
    os.mkfifo(fifo)
    return {
        "GOOD": str(good),
        "CORRUPT": str(corrupt),
        "FIFO": str(fifo),
        "DIR": str(root),
        "OUT": str(root / "out.file"),
        "LONG": str(root / ("x" * 300)),
        "LONGDIR": str(root / ("y" * 300) / "out.sft"),
        "NODIR": "/nonexistent-scratchformer/sub/out.safetensors",
    }


def _argv(template: str, files: dict[str, str]) -> list[str]:
    return [files.get(word, word) for word in template.split()]


CASES = [
    # (command line, a word the message must hold)
    ("", "required"),
    ("nosuch", "invalid choice"),
    ("trace --capture", "expected one argument"),
    ("trace -o LONG", "too long"),
    ("trace -o LONGDIR", "too long"),
    ("trace -o DIR", "folder"),
    ("trace -o NODIR", "does not exist"),
    ("trace --capture values --value-cap-mb inf -o OUT", "finite"),
    ("trace --capture values --value-cap-mb nan -o OUT", "finite"),
    ("trace --capture values --value-cap-mb -1 -o OUT", "not in"),
    ("trace --capture values --value-cap-mb 0 -o OUT", "not in"),
    ("trace --checkpoint FIFO -o OUT", "FIFO"),
    ("trace --checkpoint /dev/zero -o OUT", "FIFO or device"),
    ("trace --checkpoint DIR -o OUT", "folder"),
    ("trace --seed 1000000000000000000000000 -o OUT", "--seed"),
    ("trace --preset nope -o OUT", "unknown preset"),
    ("report FIFO", "FIFO"),
    ("report /dev/zero", "device"),
    ("report DIR", "folder"),
    ("report LONG", "too long"),
    ("report CORRUPT", "truncated"),
    ("report /no/such/file.sft", "no such file"),
    ("report GOOD -o DIR", "folder"),
    ("report GOOD -o NODIR", "does not exist"),
    ("report GOOD -o FIFO", "FIFO"),
    ("report GOOD -o out.unknown", "report format"),
    ("diff GOOD GOOD -o DIR", "folder"),
    ("diff GOOD GOOD -o NODIR", "does not exist"),
    ("diff GOOD /no/such.sft", "no such file"),
    ("diff GOOD GOOD --atol nan", "finite"),
    ("diff GOOD GOOD --atol -1", "not in"),
    ("generate --demo --prompt a --temperature nan", "finite"),
    ("generate --demo --prompt a --temperature inf", "finite"),
    ("generate --demo --prompt a --temperature -1", "not in"),
    ("generate --demo --prompt a --max-new-tokens -3", "--max-new-tokens"),
    ("generate --demo --prompt a --top-k 0", "--top-k"),
    ("generate --checkpoint FIFO --prompt a", "FIFO"),
    ("generate --checkpoint /dev/zero --prompt a", "device"),
    ("generate --checkpoint LONG --prompt a", "too long"),
    ("generate --demo --prompt ''", "required"),
    ("train --task reverse --threads -1 -o OUT", "--threads"),
    ("train --task reverse --threads 0 -o OUT", "--threads"),
    ("train --task reverse --batch-size 1e12 -o OUT", "--batch-size"),
    ("train --task reverse --batch-size 1000000000000 -o OUT", "--batch-size"),
    ("train --task reverse --batch-size 1048576 -o OUT", "GiB"),
    ("train --task reverse --d-model 1048576 --n-heads 1 -o OUT", "GiB"),
    ("train --task reverse --lr inf -o OUT", "finite"),
    ("train --task reverse --lr 0 -o OUT", "not in"),
    ("train --task reverse --dropout 2 -o OUT", "not in"),
    ("train --task reverse --steps 0 -o OUT", "--steps"),
    ("train --task reverse --preset nope -o OUT", "unknown preset"),
    ("train --task reverse -o DIR", "folder"),
    ("train --task reverse -o NODIR", "does not exist"),
    ("train --task reverse -o LONG", "too long"),
    ("train --text FIFO -o OUT", "FIFO"),
    ("train --task reverse --trace-step 0 -o OUT", "--trace-step"),
    ("train --task reverse --trace-step 1 --trace-out DIR -o OUT", "folder"),
    ("train --task reverse --trace-on-nonfinite --trace-out NODIR -o OUT", "does not exist"),
    ("train --text /dev/zero -o OUT", "device"),
    ("app FIFO", "FIFO"),
    ("app /dev/zero", "device"),
    ("app --compare GOOD /no/such.sft", "no such"),
    ("bench --repeat 0", "--repeat"),
    ("bench --threads -2", "--threads"),
    ("bench --tmp /no/such/folder --quick", "no such folder"),
]


@pytest.mark.parametrize(("template", "word"), CASES, ids=[c[0] or "(none)" for c in CASES])
def test_a_bad_command_line_is_one_error_line_and_exit_2(template, word, files, capsys):
    argv = _argv(template, files)
    if template.endswith("--prompt ''"):
        argv = [*argv[:-1], ""]
        word = "empty"
    try:
        status = main(argv)
    except SystemExit as e:  # argparse's errors exit from inside parse_args
        status = e.code
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert status == 2, captured.err
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("error: "), lines[0]
    assert word in lines[0], lines[0]
    assert captured.out == ""
    assert not Path("/nonexistent-scratchformer").exists()
    assert not Path(files["OUT"]).exists()


def test_a_tiny_temperature_is_greedy(capsys):
    """1e-45 would overflow the logits (x / 1e-45 = inf); it samples as temperature 0."""
    outputs = []
    for temperature in ("0", "1e-45", "1e-9"):
        assert main(["generate", "--demo", "--prompt", "hello", "--temperature", temperature]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] == outputs[2]


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["trace", "--capture", "nope", "-o", "x"], "invalid choice"),
        (["report", "/dev/zero"], "device"),
    ],
)
def test_the_console_command_prints_one_line_too(argv, word, tmp_path):
    """Through a real interpreter: exit status 2 and one line, argparse's errors included."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and word in lines[0], result.stderr
