"""A leftover's name is anyone's: ``NAME.PID-TID.partial`` with a pid no process can have
(0, past the kernel's range, hundreds of digits) is a capture whose writer is gone, never
an ``OverflowError`` traceback: ``recover``, ``report`` and ``tracing.load`` all take it."""

from __future__ import annotations

import shutil

import pytest
from helpers.golden.handmade import handmade_trace

import tracing
from app.cli import main
from tracing.file import journal

PIDS = ["0", str(2**31), str(2**64), "9" * 200]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("leftover") / "t.sft"
    handmade_trace().save(path)
    return path


@pytest.mark.parametrize("pid", PIDS, ids=len)
def test_a_leftover_with_any_pid_is_recovered_not_a_traceback(saved, tmp_path, capsys, pid):
    leftover = tmp_path / f"t.sft.{pid}-7.partial"
    shutil.copy(saved, leftover)
    assert not journal.is_alive(leftover)
    assert main(["report", str(leftover), "--format", "md"]) == 0
    assert main(["recover", str(leftover), "-o", str(tmp_path / "back.sft")]) == 0, capsys
    assert len(tracing.load(tmp_path / "back.sft").steps) == len(handmade_trace().steps)
    assert not leftover.exists()


def test_a_journal_without_its_partial_is_one_error_line(tmp_path, capsys):
    leftover = tmp_path / f"t.sft.{2**70}-7.journal"
    leftover.write_text("{}")
    assert main(["recover", str(leftover)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
