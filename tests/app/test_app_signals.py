"""``scratchformer app`` ends on SIGTERM and on Ctrl-C (SIGINT) while its event loop
idles, as Qt apps do (``app.signals``): a real process, real signals. Before, only
SIGKILL ended it: the command line's Python handler never ran inside Qt's loop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import tracing

ROOT = Path(__file__).resolve().parents[2]


def _open_app_on(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """The app on a small trace file, once it has opened it (it writes the file to its
    recent-files list: the settings file, kept in ``tmp_path`` by XDG_CONFIG_HOME)."""
    path = tmp_path / "small.sft"
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    tracing.save(tracing.trace(model, torch.randn(2, 4)), path)
    config = tmp_path / "config"
    env = dict(os.environ, PYTHONPATH=str(ROOT), QT_QPA_PLATFORM="offscreen",
               XDG_CONFIG_HOME=str(config))  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "app", str(path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(proc.communicate())
        opened = [p for p in config.rglob("*.conf") if path.name in p.read_text(errors="replace")]
        if opened:
            time.sleep(0.5)  # the event loop idles now
            return proc, path
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the app never opened the trace")


@pytest.mark.parametrize(
    ("signum", "status", "said"),
    [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")],
)
def test_the_app_ends_on_sigterm_and_ctrl_c_within_a_second(tmp_path, signum, status, said):
    proc, _ = _open_app_on(tmp_path)
    try:
        sent = time.monotonic()
        proc.send_signal(signum)
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running 10 s after signal {signum}") from None
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == status, err
    assert said in err and "Traceback" not in err, err
    # within a second on a quiet machine; the margin is for a loaded test runner
    assert took < 3, f"{took:.2f} s"
