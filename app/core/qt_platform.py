"""Can Qt open a window here? The system libraries its xcb platform plugin needs, checked
before Qt is loaded.

On Linux, Qt draws on X11 through its ``xcb`` platform plugin (``libqxcb.so``, inside the
PySide6 wheel), which needs about twenty system libraries the wheel does not ship
(``libxcb-icccm.so.4``, ``libxcb-keysyms.so.1``, ``libxcb-cursor.so.0``...). When one is
missing, Qt prints a hint that can name the wrong one and aborts the process. So
``scratchformer app`` asks first: :func:`missing_libraries` runs ``ldd`` on the plugin and
collects what it reports ``not found``; :func:`platform_problem` turns that into one
line naming the libraries and the ``apt-get install`` line that brings them. Qt-free: it
only locates the PySide6 package, never imports it.

>>> platform_problem({"QT_QPA_PLATFORM": "offscreen"}) is None  # no plugin needs X11
True
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

DEBIAN_PACKAGES: dict[str, str] = {
    # the libraries (soname without its version) libqxcb.so and the Qt libraries under it
    # need from the system, and the Debian/Ubuntu package of each (found with ``ldd`` on
    # the plugin and ``dpkg -S`` on what it resolved to)
    "libEGL": "libegl1",
    "libGL": "libgl1",
    "libGLX": "libglx0",
    "libGLdispatch": "libglvnd0",
    "libX11": "libx11-6",
    "libX11-xcb": "libx11-xcb1",
    "libXau": "libxau6",
    "libXdmcp": "libxdmcp6",
    "libdbus-1": "libdbus-1-3",
    "libfontconfig": "libfontconfig1",
    "libfreetype": "libfreetype6",
    "libglib-2.0": "libglib2.0-0",
    "libgthread-2.0": "libglib2.0-0",
    "libxcb": "libxcb1",
    "libxcb-cursor": "libxcb-cursor0",
    "libxcb-icccm": "libxcb-icccm4",
    "libxcb-image": "libxcb-image0",
    "libxcb-keysyms": "libxcb-keysyms1",
    "libxcb-randr": "libxcb-randr0",
    "libxcb-render": "libxcb-render0",
    "libxcb-render-util": "libxcb-render-util0",
    "libxcb-shape": "libxcb-shape0",
    "libxcb-shm": "libxcb-shm0",
    "libxcb-sync": "libxcb-sync1",
    "libxcb-util": "libxcb-util1",
    "libxcb-xfixes": "libxcb-xfixes0",
    "libxcb-xkb": "libxcb-xkb1",
    "libxkbcommon": "libxkbcommon0",
    "libxkbcommon-x11": "libxkbcommon-x11-0",
}

_NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found", re.M)


def xcb_plugin() -> Path | None:
    """``PySide6/Qt/plugins/platforms/libqxcb.so`` of the installed PySide6, or None."""
    spec = importlib.util.find_spec("PySide6")
    for root in (spec.submodule_search_locations or []) if spec else []:
        plugin = Path(root) / "Qt" / "plugins" / "platforms" / "libqxcb.so"
        if plugin.is_file():
            return plugin
    return None


def uses_xcb(env: Mapping[str, str]) -> bool:
    """Whether Qt will pick its xcb plugin: on Linux, when ``QT_QPA_PLATFORM`` names xcb
    first, or is unset outside a Wayland session."""
    if not sys.platform.startswith("linux"):
        return False
    chosen = env.get("QT_QPA_PLATFORM", "").split(";")[0].split(":")[0].strip()
    if chosen:
        return chosen == "xcb"
    return not env.get("WAYLAND_DISPLAY")


def missing_libraries(plugin: Path) -> list[str]:
    """The sonames ``ldd`` reports ``not found`` for ``plugin`` (directly or through the
    libraries it loads), in its order; [] when all load or ``ldd`` is not there."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return []
    try:
        out = subprocess.run(
            [ldd, str(plugin)], capture_output=True, text=True, timeout=20, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return list(dict.fromkeys(_NOT_FOUND.findall(out)))


def package_of(soname: str) -> str | None:
    """The Debian/Ubuntu package that ships ``soname`` (``libxcb-icccm.so.4`` ->
    ``libxcb-icccm4``), None for a library not in the table."""
    return DEBIAN_PACKAGES.get(soname.split(".so", 1)[0])


def platform_problem(
    env: Mapping[str, str] | None = None, plugin: Path | None = None
) -> str | None:
    """One line saying which libraries Qt's xcb plugin is missing and how to install
    them, or None when nothing is missing (or Qt will not use xcb)."""
    env = os.environ if env is None else env
    if not uses_xcb(env):
        return None
    plugin = plugin or xcb_plugin()
    if plugin is None:
        return None
    missing = missing_libraries(plugin)
    if not missing:
        return None
    packages = list(dict.fromkeys(p for p in map(package_of, missing) if p))
    unknown = [name for name in missing if package_of(name) is None]
    parts = [f"Qt cannot load its xcb platform plugin: missing {', '.join(missing)}"]
    if packages:
        parts.append(f"on Debian/Ubuntu install them with: apt-get install -y {' '.join(packages)}")
    if unknown:
        parts.append(f"install what provides {', '.join(unknown)} with your package manager")
    return "; ".join(parts)
