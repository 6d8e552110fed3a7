"""A full disk or a file-size limit while a trace streams keeps the trace up to the last
complete value, at a path the error names, and leaves no stray temporary file.

The limits are real: ``RLIMIT_FSIZE`` in a subprocess (a write past it fails with EFBIG;
Python ignores SIGXFSZ), and a small tmpfs where this machine lets us mount one."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tracing
from tracing.file.writer import HEADER_RESERVE

ROOT = Path(__file__).resolve().parents[3]

# a trace of N steps and no values: its manifest and graph are what the file holds
LOOP = """
import sys, torch, tracing
from tracing.errors import TraceFileError
class Loop(torch.nn.Module):
    def forward(self, x):
        for _ in range({n}):
            x = x + 1
        return x
try:
    trace = tracing.trace(Loop(), torch.zeros(2), capture="shapes", out=sys.argv[1])
    print("closed", len(trace.steps))
except TraceFileError as e:
    print("kept", getattr(e, "kept", "-"), e)
"""


def _run_limited(code: str, out: Path, limit: int) -> subprocess.CompletedProcess:
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code, str(out)], env=env, capture_output=True,
                          text=True, timeout=120, preexec_fn=set_limit)  # fmt: skip


def _strays(folder: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


def test_a_size_limit_at_the_manifest_still_finishes_the_file(tmp_path):
    """The graph does not fit under the limit as an entry after the data, but fits in the
    header's reserve: the file is finished whole (before: deleted, with its journal)."""
    out = tmp_path / "loop.sft"
    done = _run_limited(LOOP.format(n=5000), out, HEADER_RESERVE + 100_000)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("closed 5001"), done.stdout  # the root call too
    trace = tracing.load(out)
    assert len(trace.steps) == 5001 and trace.error is None
    assert _strays(tmp_path, {"loop.sft"}) == []


def test_a_size_limit_with_no_room_for_the_header_keeps_a_partial_file_it_names(tmp_path):
    """Manifest and graph outgrow the reserve and the limit stops the entries after the
    data: the streamed file stays, with a journal, and the error names it."""
    out = tmp_path / "loop.sft"
    done = _run_limited(LOOP.format(n=8000), out, HEADER_RESERVE + 600_000)
    assert done.returncode == 0, done.stderr
    words = done.stdout.split()
    assert words[0] == "kept", done.stdout
    partial = Path(words[1])
    assert partial.parent == tmp_path and partial.name.endswith(".partial")
    assert "File too large" in done.stdout and f"kept in {partial}" in done.stdout
    assert done.stdout.count("cannot write") == 1, done.stdout
    trace = tracing.load(partial)  # the error's path opens: every step is there
    assert len(trace.steps) == 8001
    journal = partial.with_name(partial.name.removesuffix(".partial") + ".journal")
    assert _strays(tmp_path, {partial.name, journal.name}) == []  # no .journal.new


def test_a_journal_that_cannot_be_written_leaves_no_temporary_file(tmp_path):
    code = """
import sys
from pathlib import Path
from tracing.file.journal import write_journal
try:
    write_journal(Path(sys.argv[1]), 8, {}, {"manifest": "x" * 200_000})
except OSError as e:
    print("refused", e.strerror)
"""
    journal = tmp_path / "t.sft.1-2.journal"
    done = _run_limited(code, journal, 50_000)
    assert done.stdout.strip() == "refused File too large", done.stderr
    assert _strays(tmp_path, set()) == []


def _mount_tmpfs(where: Path, size: str) -> bool:
    if shutil.which("mount") is None or os.geteuid() != 0:
        return False
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True)  # fmt: skip
    return done.returncode == 0


def test_a_full_disk_keeps_the_values_written_and_the_error_names_the_file(tmp_path):
    """A real full file system (a 300 kB tmpfs) while the demo model streams its values:
    the header still fits (its room is held from the start), every value kept reads back
    and passes its checksum."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "300k"):
        pytest.skip("no tmpfs can be mounted here (needs root)")
    try:
        out = disk / "demo.sft"
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        done = subprocess.run(
            [sys.executable, "-m", "app.cli", "trace", "--capture", "values", "-o", str(out),
             "--quiet"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:"), lines
        assert "No space left on device" in lines[0] and f"saved to {out}" in lines[0]
        trace = tracing.load(out)
        assert "No space left on device" in trace.error
        kept = [r for r in trace.tensors if r.value_key is not None]
        assert kept and all(trace.value(r.id) is not None for r in kept)  # checksums pass
        trace.values.close()
        assert _strays(disk, {"demo.sft"}) == []
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
