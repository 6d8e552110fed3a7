"""Before Qt loads, ``scratchformer app`` checks the system libraries of Qt's xcb plugin:
a missing one is one ``error:`` line naming it and the apt line, never Qt's abort.

A machine that lacks a library is made by copying the real ``libqxcb.so`` with the names
of two libraries it needs changed to ones that do not exist (same length, so the ELF
stays valid), beside a link to the wheel's own Qt libraries: ``ldd`` then really reports
them missing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.core import qt_platform

ROOT = Path(__file__).resolve().parents[3]
GONE = {b"libxcb-icccm.so.4": b"libxcb-icccm.so.9", b"libxcb-keysyms.so.1": b"libxcb-keysyms.so.9"}

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or qt_platform.xcb_plugin() is None,
    reason="Qt's xcb plugin is Linux-only",
)


@pytest.fixture
def broken_plugin(tmp_path) -> Path:
    """A copy of libqxcb.so that needs two libraries no system has."""
    real = qt_platform.xcb_plugin()
    assert real is not None
    qt = tmp_path / "Qt"
    (qt / "plugins" / "platforms").mkdir(parents=True)
    (qt / "lib").symlink_to(real.parents[2] / "lib")  # its RUNPATH: $ORIGIN/../../lib
    data = real.read_bytes()
    for name, gone in GONE.items():
        assert data.count(name) == 1
        data = data.replace(name, gone)
    plugin = qt / "plugins" / "platforms" / "libqxcb.so"
    plugin.write_bytes(data)
    return plugin


def test_missing_libraries_are_what_ldd_cannot_find(broken_plugin):
    # what this machine lacks already (a bare one may lack more than the two made missing)
    lacks = set(qt_platform.missing_libraries(qt_platform.xcb_plugin()))
    found = [m for m in qt_platform.missing_libraries(broken_plugin) if m not in lacks]
    assert found == [g.decode() for g in GONE.values()]


def test_the_problem_names_the_libraries_and_the_apt_line(broken_plugin):
    problem = qt_platform.platform_problem({}, broken_plugin)
    assert problem is not None and "\n" not in problem
    assert "missing libxcb-icccm.so.9, libxcb-keysyms.so.9" in problem
    assert problem.endswith("apt-get install -y libxcb-icccm4 libxcb-keysyms1")


def test_only_the_xcb_platform_is_checked(broken_plugin, monkeypatch):
    for env in ({"QT_QPA_PLATFORM": "offscreen"}, {"WAYLAND_DISPLAY": "wayland-0"}):
        assert qt_platform.platform_problem(env, broken_plugin) is None
    assert qt_platform.platform_problem({"QT_QPA_PLATFORM": "xcb"}, broken_plugin)
    assert qt_platform.platform_problem({"QT_QPA_PLATFORM": "xcb;offscreen"}, broken_plugin)


def test_every_library_the_check_can_name_is_in_the_readme_apt_line():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    line = re.search(r"apt-get install -y --no-install-recommends ([^`]+)`", readme)
    assert line is not None
    listed = set(line.group(1).split())
    assert set(qt_platform.DEBIAN_PACKAGES.values()) <= listed


def test_every_system_library_of_the_real_plugin_has_its_package():
    """What ``ldd`` resolves for the plugin outside the wheel and outside the C runtime
    (and what those libraries need in turn) is in the table, so a missing one is named
    with its package."""
    out = subprocess.run(
        ["ldd", str(qt_platform.xcb_plugin())], capture_output=True, text=True, check=True
    ).stdout
    names = {m.split(".so", 1)[0] for m in re.findall(r"^\s*(\S+)\s+=>", out, flags=re.M)}
    ours = {"libQt6Core", "libQt6Gui", "libQt6DBus", "libQt6XcbQpa"}
    x_and_gl = {n for n in names - ours if re.match(r"lib(xcb|X|GL|EGL|xkb|fontc|freet)", n)}
    assert x_and_gl and x_and_gl <= set(qt_platform.DEBIAN_PACKAGES)


def test_app_command_says_what_is_missing_instead_of_aborting(broken_plugin, tmp_path):
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "import app.core.qt_platform as q\n"
        f"q.xcb_plugin = lambda: Path({str(broken_plugin)!r})\n"
        "from app.cli import main\n"
        "sys.exit(main(['app']))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
    env["DISPLAY"] = ":99"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: Qt cannot load its xcb platform")
    assert "apt-get install -y libxcb-icccm4 libxcb-keysyms1" in lines[0]


def test_tracing_show_says_the_same_before_loading_qt(broken_plugin, monkeypatch):
    import app.windows.live_show as live_show

    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setenv("DISPLAY", ":99")
    monkeypatch.setattr(qt_platform, "xcb_plugin", lambda: broken_plugin)
    why = live_show.can_run_here()
    assert why is not None and why.endswith("apt-get install -y libxcb-icccm4 libxcb-keysyms1")
