"""What every command checks before it works: paths, and numbers from the command line.

A command calls these first, so a bad argument is one ``error:`` line in a second rather
than a traceback after an hour of training:

- :func:`input_file` accepts a regular file only (a FIFO would block the read forever,
  ``/dev/zero`` would never end);
- :func:`output_file` checks the folder exists and may be written, and that the target
  is not a folder, a FIFO or a device, nor one of the command's ``inputs`` (the same file
  by device and inode, whatever its spelling: a symlink or a hard link is caught too). It
  never creates folders: only what the user named is written. An input that is a
  folder (a Hugging Face model folder) is read whole: nothing inside it may be an output.
- :func:`output_folder` the same for a command that writes a folder of files
  (``generate --trace``): not an input, not inside an input folder, not holding an input.
  :func:`not_an_input` only the first two, for a scratch folder (``bench --tmp``).
- :func:`replace_atomically` writes a finished file under a temporary name beside the
  target, then renames it over the target: an existing output is never half-replaced.
- the ``*_int`` / ``*_float`` factories are argparse ``type=`` functions: ``nan``, ``inf``,
  negatives and absurd sizes are refused while parsing, with the option's name.

Paths the operating system cannot take (a name over 255 bytes, a folder it may not
enter) are reported the same way, never as an ``OSError`` traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path


class PathProblem(Exception):
    """A path the command cannot use; the message names it and says why."""


def _stat(path: Path) -> os.stat_result | None:
    """``os.stat``, with None for a missing file and a PathProblem for anything odd."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise PathProblem(f"cannot use {_shown(path)}: {e.strerror or e}") from None
    except ValueError as e:  # an embedded NUL byte
        raise PathProblem(f"cannot use {_shown(path)}: {e}") from None


def _shown(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 120 else text[:60] + "..." + text[-40:]


def input_file(path: str | os.PathLike, what: str = "file") -> Path:
    """``path`` as a Path if it is an existing, readable regular file."""
    path = Path(path)
    info = _stat(path)
    if info is None:
        raise PathProblem(f"no such {what}: {_shown(path)}")
    if stat.S_ISDIR(info.st_mode):
        raise PathProblem(f"{_shown(path)} is a folder, not a {what}")
    if not stat.S_ISREG(info.st_mode):
        raise PathProblem(f"{_shown(path)} is not a regular file (a FIFO or device); refused")
    if not os.access(path, os.R_OK):
        raise PathProblem(f"cannot read {_shown(path)}: permission denied")
    return path


def output_file(
    path: str | os.PathLike, *, inputs: Iterable[str | os.PathLike | None] = ()
) -> Path:
    """``path`` as a Path if a file can be written there; creates nothing.

    ``inputs`` are the files (and folders) the command reads: the output may be none of
    them, nor the folder of any of them, compared by device and inode."""
    path = Path(path)
    info = _stat(path)
    _not_an_input(path, info, inputs)
    if info is not None:
        if stat.S_ISDIR(info.st_mode):
            raise PathProblem(f"cannot write {_shown(path)}: it is a folder")
        if not stat.S_ISREG(info.st_mode):
            raise PathProblem(
                f"cannot write {_shown(path)}: not a regular file (a FIFO or device); refused"
            )
    folder = path.parent if str(path.parent) else Path(".")
    folder_info = _stat(folder)
    if folder_info is None or not stat.S_ISDIR(folder_info.st_mode):
        raise PathProblem(
            f"cannot write {_shown(path)}: the folder {_shown(folder)} does not exist"
        )
    if len(os.fsencode(path.name)) > 255:
        raise PathProblem(f"cannot write {_shown(path)}: the file name is too long")
    writable = os.access(folder, os.W_OK | os.X_OK)
    if not writable or (info is not None and not os.access(path, os.W_OK)):
        raise PathProblem(f"cannot write {_shown(path)}: permission denied")
    return path


def output_folder(
    path: str | os.PathLike, *, inputs: Iterable[str | os.PathLike | None] = ()
) -> Path:
    """``path`` as a Path if a command may write its files into it (a folder that exists,
    or one it may create in a folder that does); creates nothing.

    The rules of :func:`output_file`, for a folder: it may not be an input, nor lie
    inside an input folder, nor hold an input (what it writes there could replace it)."""
    path, inputs = Path(path), list(inputs)
    info = _stat(path)
    if info is not None and not stat.S_ISDIR(info.st_mode):
        raise PathProblem(f"cannot write into {_shown(path)}: it exists and is not a folder")
    _not_an_input(path, info, inputs)
    if info is not None:
        mine = (info.st_dev, info.st_ino)
        for given in inputs:
            if given is not None and mine in _folders_holding(Path(given)):
                raise PathProblem(
                    f"cannot write into {_shown(path)}: it holds {_shown(Path(given))}, an "
                    "input of this command; choose another folder"
                )
    folder = path.parent if str(path.parent) else Path(".")
    folder_info = _stat(folder)
    if folder_info is None or not stat.S_ISDIR(folder_info.st_mode):
        raise PathProblem(
            f"cannot write {_shown(path)}: the folder {_shown(folder)} does not exist"
        )
    target = path if info is not None else folder
    if not os.access(target, os.W_OK | os.X_OK):
        raise PathProblem(f"cannot write into {_shown(path)}: permission denied")
    return path


def not_an_input(
    path: str | os.PathLike, *, inputs: Iterable[str | os.PathLike | None] = ()
) -> Path:
    """``path`` if it is none of ``inputs``, not the folder of one, and not inside an
    input folder (a scratch folder a command makes its own files in: ``bench --tmp``)."""
    path = Path(path)
    _not_an_input(path, _stat(path), inputs, folder_of=False)
    return path


def _folders_holding(path: Path) -> set[tuple[int, int]]:
    """(device, inode) of every folder above ``path`` once its links are resolved: the
    folders it lies inside, whatever spelling, symlink or bind mount reaches them."""
    try:
        real = Path(os.path.realpath(path))
    except (OSError, ValueError):
        return set()
    found = set()
    for folder in real.parents:
        try:
            info = os.stat(folder)
        except (OSError, ValueError):
            continue
        found.add((info.st_dev, info.st_ino))
    return found


def _links_inside(folder: Path, info: os.stat_result, limit: int = 10_000) -> bool:
    """Whether a file in ``folder`` (up to ``limit`` entries, at any depth) is the file
    ``info`` describes: a hard link made elsewhere to a file of an input folder."""
    seen = 0
    walk = os.walk(folder)
    try:
        for root, _dirs, names in walk:
            for name in names:
                seen += 1
                if seen > limit:
                    return False
                try:
                    other = os.stat(os.path.join(root, name))
                except (OSError, ValueError):
                    continue
                if (other.st_dev, other.st_ino) == (info.st_dev, info.st_ino):
                    return True
    finally:
        walk.close()  # its open folder listing too, when the answer came early
    return False


def _not_an_input(
    path: Path,
    info: os.stat_result | None,
    inputs: Iterable[str | os.PathLike | None],
    *,
    folder_of: bool = True,
) -> None:
    """A PathProblem if ``path`` (stat ``info``, None if it does not exist yet) is one of
    ``inputs``, the folder of one (unless not ``folder_of``), or lies inside an input that
    is a folder (a model folder is read whole: its weights, config and tokenizer are all
    inputs)."""
    holders = None  # the folders ``path`` lies inside, computed once when a folder is given
    for given in inputs:
        if given is None:
            continue
        given = Path(given)
        if os.path.abspath(given) == os.path.abspath(path):  # also when neither exists yet
            raise PathProblem(
                f"cannot write {_shown(path)}: it is an input of this command; "
                "choose another output"
            )
        try:
            given_info = os.stat(given)
        except (OSError, ValueError):
            given_info = None
        if given_info is not None and stat.S_ISDIR(given_info.st_mode):
            if holders is None:
                holders = _folders_holding(path)
            inside = (given_info.st_dev, given_info.st_ino) in holders
            if inside or (info is not None and info.st_nlink > 1 and _links_inside(given, info)):
                raise PathProblem(
                    f"cannot write {_shown(path)}: it lies inside the input folder "
                    f"{_shown(given)} (its files are read, never written); choose another output"
                )
        if info is None:
            continue
        folder = given.parent if str(given.parent) else Path(".")
        candidates = [(given, "an input of this command"), (folder, "the folder of")]
        for candidate, what in candidates[: 2 if folder_of else 1]:
            try:
                other = os.stat(candidate)
            except (OSError, ValueError):
                continue
            if (other.st_dev, other.st_ino) == (info.st_dev, info.st_ino):
                raise PathProblem(
                    f"cannot write {_shown(path)}: it is {what} {_shown(given)}; "
                    "choose another output"
                )


def replace_atomically(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` with a temporary path beside ``path``, then rename the finished
    file over ``path``; on any failure the temporary file is removed and ``path`` is as
    it was. A FIFO or a device (``/dev/null``) is written directly."""
    path = Path(path)
    if os.path.lexists(path) and not path.is_file() and not path.is_dir():
        write(path)
        return path
    folder = path.parent if str(path.parent) else Path(".")
    fd, name = tempfile.mkstemp(dir=folder, prefix=f".{path.name[:100]}.", suffix=".partial")
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --------------------------------------------------------------------------- numbers


def int_between(low: int, high: int):
    """An argparse type: a whole number in ``[low, high]``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r:.40} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not between {low:,} and {high:,}")
        return value

    parse.__name__ = "whole number"
    return parse


def float_between(low: float, high: float, *, low_open: bool = False):
    """An argparse type: a finite number in ``[low, high]`` (``(low, high]`` if
    ``low_open``); ``nan`` and ``inf`` are refused."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r:.40} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r:.40} is not a finite number")
        if value < low or (low_open and value == low) or value > high:
            bracket = "(" if low_open else "["
            raise argparse.ArgumentTypeError(f"{value:g} is not in {bracket}{low:g}, {high:g}]")
        return value

    parse.__name__ = "number"
    return parse


SEED = int_between(0, 2**63 - 1)
"""A random seed torch accepts."""

THREADS = int_between(1, 1024)
"""A count of CPU threads."""
