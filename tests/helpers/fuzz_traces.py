"""A seeded fuzzer for trace files: mutate good files, open each in a child, classify.

Every case is a good trace file with one mutation — bit flips, a truncation, a new header
length, garbage appended, a structural change to the JSON manifest (a hostile value, a
deleted or duplicated field, a swapped row), a cycle or a long chain in the call tree,
deep nesting, huge sizes, odd ``meta`` — written to disk and run in a forked child with a
memory limit (``RLIMIT_AS``), a CPU limit and a wall-clock alarm, through ``tracing.load``
and every consumer: the graph, the collapsed views, attention maps, all report formats,
every value read, the stored graph, and (for some files that load) the desktop app,
offscreen. Each case ends as one of

- ``error``: ``load`` refused it with one ``TraceFileError`` (a clean error);
- ``loaded``: it loaded and every consumer ran (a value read may raise ``TraceFileError``:
  a checksum caught the damage);
- ``failure``: anything else — another exception, a crash by signal, a timeout, running
  out of the memory limit. The count of failures must be 0.

Run it from the test suite (``tests/test_fuzz_trace_files.py``) or by hand::

    PYTHONPATH=$PWD python tests/helpers/fuzz_traces.py --cases 2000 --seed 1

The driver forks one child per case from a process that has imported torch, tracing and
Qt once (no QApplication exists in the parent), so a case costs milliseconds, not an
interpreter start.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import random
import resource
import select
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for helpers.*
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("PYQTGRAPH_QT_LIB", "PySide6")

CASES_VARIABLE = "SCRATCHFORMER_FUZZ_CASES"
"""Environment variable: how many cases the test suite runs (default 200)."""

MEMORY_LIMIT = 1536 * 2**20
"""Address space a case may add on top of the parent's (bytes)."""

TIME_LIMIT_S = 20
"""Wall-clock seconds a case may take (load and every consumer together)."""

# --------------------------------------------------------------------------- seeds


def make_seeds(folder: Path) -> list[Path]:
    """Good trace files to mutate: hand-made ones that hold the awkward cases, a tiny
    decoder with attention maps, and one whose manifest is stored as a tensor."""
    from helpers.app_fixtures import tiny_trace
    from helpers.golden.handmade import handmade_trace
    from tracing.file import saving as trace_file  # save() reads the inline limit there

    seeds = []
    for name, trace in (
        ("handmade_values", handmade_trace()),
        ("handmade_stats", handmade_trace(with_values=False)),
        ("tiny_decoder", tiny_trace(n_layers=2, T=4, C=8, H=2, V=8)),
    ):
        path = folder / f"{name}.sft"
        trace.save(path)
        seeds.append(path)
    limit = trace_file.MANIFEST_INLINE_LIMIT
    trace_file.MANIFEST_INLINE_LIMIT = 10
    try:
        path = folder / "manifest_tensor.sft"
        handmade_trace().save(path)
        seeds.append(path)
    finally:
        trace_file.MANIFEST_INLINE_LIMIT = limit
    return seeds


# --------------------------------------------------------------------------- mutations


def _split(data: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _join(header: dict, body: bytes) -> bytes:
    text = json.dumps(header, separators=(",", ":")).encode("utf-8", "surrogatepass")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + body


def _deep(depth: int) -> object:
    value: object = []
    for _ in range(depth):
        value = [value]
    return value


def _hostile(rng: random.Random) -> object:
    """A value no writer produces: wrong type, out of range, huge, odd text, nested."""
    return rng.choice(
        [
            None,
            True,
            -1,
            0,
            7,
            2**31,
            2**63,
            10**400,
            -(10**30),
            1e308,
            float("inf"),
            float("nan"),
            "",
            "x" * rng.choice([10, 100_000]),
            "\ud800",
            "<script>",
            [],
            {},
            [[[]]],
            [1, "a", [2], None],
            {"__tuple__": 1},
            {"__items__": [[1]]},
            {"__items__": [[[1, 2], 3], [{"a": 1}, 2]]},
            list(range(rng.choice([3, 100_000]))),
            _deep(rng.choice([60, 600])),
        ]
    )


def _pick(value: object, rng: random.Random, path: list) -> list:
    """A random path into a JSON tree (stops early at random, or at a leaf)."""
    while isinstance(value, (dict, list)) and value and rng.random() < 0.8:
        key = rng.choice(list(value)) if isinstance(value, dict) else rng.randrange(len(value))
        path.append(key)
        value = value[key]
    return path


def _get(root: object, path: list) -> object:
    for key in path:
        root = root[key]  # type: ignore[index]
    return root


def _mutate_tree(root: dict, rng: random.Random) -> str:
    path = _pick(root, rng, [])
    if not path:
        root[rng.choice(["meta", "steps", "tensors", "modules", "sources"])] = _hostile(rng)
        return "replace a table"
    parent, key = _get(root, path[:-1]), path[-1]
    how = rng.choice(["replace", "replace", "delete", "duplicate", "swap", "wrap"])
    if how == "replace":
        parent[key] = _hostile(rng)  # type: ignore[index]
    elif how == "delete":
        del parent[key]  # type: ignore[union-attr]
    elif how == "duplicate" and isinstance(parent, list):
        parent.insert(key, copy.deepcopy(parent[key]))
    elif how == "swap" and isinstance(parent, list) and len(parent) > 1:
        other = rng.randrange(len(parent))
        parent[key], parent[other] = parent[other], parent[key]
    else:
        parent[key] = [parent[key]]  # type: ignore[index]
    return f"{how} at {'/'.join(map(str, path))[:60]}"


def _steps_table(manifest: dict) -> tuple[list[str], list[list]]:
    return manifest["steps"]["fields"], manifest["steps"]["rows"]


def _mutate_call_tree(manifest: dict, rng: random.Random) -> str:
    fields, rows = _steps_table(manifest)
    parent_at, depth_at, end_at = (fields.index(f) for f in ("parent", "depth", "end"))
    i = rng.randrange(len(rows))
    how = rng.choice(["self", "later", "chain", "depth", "end"])
    if how == "self":
        rows[i][parent_at] = i
    elif how == "later":
        rows[i][parent_at] = rng.randrange(i, len(rows))
    elif how == "chain":  # a long chain of module calls, each the parent of the next
        template = next((r for r in rows if r[0] == "module"), rows[0])
        n = rng.choice([300, 3000])
        start = len(rows)
        for k in range(n):
            row = list(template)
            row[fields.index("index")] = start + k
            row[parent_at] = start + k - 1 if k else None
            row[depth_at] = k
            row[end_at] = start + n - 1
            rows.append(row)
    elif how == "depth":
        rows[i][depth_at] = rng.choice([-1, 10**6, 10**400])
    else:
        rows[i][end_at] = rng.choice([i - 1, len(rows) - 1, 0])
    return f"call tree: {how} at step {i}"


def _mutate_entries(header: dict, rng: random.Random) -> str:
    names = [k for k in header if k != "__metadata__"]
    if not names:
        return "no entries"
    name = rng.choice(names)
    entry = header[name]
    how = rng.choice(["dtype", "shape", "offsets", "swap", "huge"])
    if how == "dtype":
        entry["dtype"] = rng.choice(["F4", "F6_E2M3", "F8_E4M3", "BF16", "I64", "U8", "X", 5])
    elif how == "shape":
        entry["shape"] = rng.choice([[], [0], [2**40, 2**40], [-1], list(range(1, 80)), "s"])
    elif how == "offsets":
        a, b = entry["data_offsets"]
        entry["data_offsets"] = rng.choice([[b, a], [a, b + 8], [0, b], [a, 2**62], [a]])
    elif how == "swap" and len(names) > 1:
        other = header[rng.choice(names)]
        entry["data_offsets"], other["data_offsets"] = other["data_offsets"], entry["data_offsets"]
    else:
        header[f"extra{rng.randrange(10**6)}"] = {
            "dtype": "U8",
            "shape": [0],
            "data_offsets": [0, 0],
        }
    return f"entry {name}: {how}"


def _mutate_meta(manifest: dict, rng: random.Random) -> str:
    meta = manifest.setdefault("meta", {})
    if not isinstance(meta, dict):
        manifest["meta"] = meta = {}
    key = rng.choice(["tokens", "text", "token_labels", "model_class", "capture", "value_dtype"])
    meta[key] = rng.choice(
        [[1, "a", [2]], [[1, 2], 3], "\udfff", ["\ud800"], 10**30, "int64", "float16", {}, None]
    )
    return f"meta {key}"


def _mutate_role(manifest: dict, rng: random.Random) -> str:
    fields, rows = manifest["tensors"]["fields"], manifest["tensors"]["rows"]
    i = rng.randrange(len(rows))
    rows[i][fields.index("role")] = "attention"
    return f"role attention on tensor {i}"


def _mutate_rank_meta(manifest: dict, rng: random.Random) -> str:
    """Rank metadata of the wrong type or out of range (issue 26: world_size 10**12,
    a rank of 10**30, collectives that are not lists, a step that is a string)."""
    meta = manifest.setdefault("meta", {})
    if not isinstance(meta, dict):
        manifest["meta"] = meta = {}
    key = rng.choice(["rank", "world_size", "collectives", "distributed", "dtensors"])
    hostile = {
        "rank": [10**30, -1, 3, "0", [0], None, 2**63],
        "world_size": [10**12, 0, -4, [2], "2", 65_537, 1],
        "collectives": [
            {},
            "all_reduce",
            [{"step": "x"}],
            [{"op": 1}],
            [{"op": "all_reduce", "step": 10**9}],
            [None],
            [[1, 2]],
        ],
        "distributed": [[], "yes", {"backend": 3}, {"world_size": 10**12}, 0],
        "dtensors": [{}, "x", [{"mesh": [10**12]}], [1, 2]],
    }[key]
    meta[key] = rng.choice(hostile)
    if key != "world_size" and rng.random() < 0.5:
        meta["world_size"] = rng.choice([2, 10**12, 1])
    return f"rank meta {key}={str(meta[key])[:40]}"


_CONTROLS = ["\x1b[2J", "\x1b]0;title\x07", "\r", "\x00", "\x9b31m", "\u202e", "\x08" * 5]


def _mutate_control_text(manifest: dict, rng: random.Random) -> str:
    """Control characters (ESC, CR, NUL, C1, bidi override) in names, ops, source lines,
    the error and meta.text: what a report or terminal must show inert."""
    bad = rng.choice(_CONTROLS) + "=cmd|' /C calc'!A0" * rng.choice([0, 1])
    where = rng.choice(["step", "source", "error", "text", "module"])
    if where == "step":
        fields, rows = _steps_table(manifest)
        row = rng.choice(rows)
        name = rng.choice([f for f in ("module", "op") if f in fields])
        i = fields.index(name)
        if isinstance(row[i], str):
            row[i] = row[i] + bad
    elif where == "source" and manifest.get("sources"):
        src = rng.choice(manifest["sources"])
        if isinstance(src, list) and len(src) > 2 and isinstance(src[2], str):
            src[2] = bad + src[2]
    elif where == "error":
        manifest["error"] = f"ValueError: {bad}"
    elif where == "text":
        meta = manifest.setdefault("meta", {})
        if isinstance(meta, dict):
            meta["text"] = bad
    else:
        modules = manifest.get("modules", {})
        if isinstance(modules, dict) and modules.get("rows"):
            row = rng.choice(modules["rows"])
            for i, v in enumerate(row):
                if isinstance(v, str):
                    row[i] = v + bad
                    break
    return f"control characters in {where}: {bad!r}"


def _mutate_long_strings(manifest: dict, rng: random.Random) -> str:
    """One long string shared by every step (a 200 kB source line, a long op or error):
    reports must stay linear in the file's size."""
    long = "x = " + "a" * rng.choice([10_000, 200_000]) + "  # " + rng.choice(_CONTROLS)
    where = rng.choice(["source", "op", "error"])
    if where == "source" and manifest.get("sources"):
        for src in manifest["sources"]:
            if isinstance(src, list) and len(src) > 2:
                src[2] = long
    elif where == "op":
        fields, rows = _steps_table(manifest)
        if "op" in fields:
            i = fields.index("op")
            for row in rows:
                row[i] = long
    else:
        manifest["error"] = long
    return f"long shared string ({len(long):,} characters) in {where}"


def _with_manifest(data: bytes, rng: random.Random, change) -> tuple[bytes, str]:
    """Apply ``change(manifest, rng)`` to the inline manifest (drop checksums at random)."""
    header, body = _split(data)
    meta = header.get("__metadata__", {})
    if "manifest" not in meta:
        return _flip(data, rng)
    manifest = json.loads(meta["manifest"])
    what = change(manifest, rng)
    meta["manifest"] = json.dumps(manifest, separators=(",", ":"))
    if rng.random() < 0.3:
        meta.pop("checksums", None)
    return _join(header, body), what


def _flip(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    out = bytearray(data)
    n = rng.choice([1, 1, 2, 8, 32])
    (header_len,) = struct.unpack("<Q", data[:8])
    for _ in range(n):
        limit = 8 + header_len if rng.random() < 0.5 else len(out)
        pos = rng.randrange(min(limit, len(out)))
        out[pos] ^= 1 << rng.randrange(8)
    return bytes(out), f"flip {n} bits"


def mutate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One mutation of a good file's bytes, and what it was."""
    kind = rng.choice(
        ["flip", "flip", "truncate", "length", "append", "tree", "tree", "tree", "calls",
         "calls", "entries", "entries", "nest", "meta", "role", "rank", "control", "long"]
    )  # fmt: skip
    if kind == "flip":
        return _flip(data, rng)
    if kind == "truncate":
        cut = rng.randrange(len(data))
        return data[:cut], f"truncate at {cut}"
    if kind == "length":
        n = rng.choice([0, 1, 7, len(data), 2**40, 2**64 - 1, 100_000_001])
        return struct.pack("<Q", n) + data[8:], f"header length {n}"
    if kind == "append":
        return data + os.urandom(rng.choice([1, 8, 4096])), "garbage appended"
    if kind == "tree":
        return _with_manifest(data, rng, _mutate_tree)
    if kind == "calls":
        return _with_manifest(data, rng, _mutate_call_tree)
    if kind == "meta":
        return _with_manifest(data, rng, _mutate_meta)
    if kind == "role":
        return _with_manifest(data, rng, _mutate_role)
    if kind == "rank":
        return _with_manifest(data, rng, _mutate_rank_meta)
    if kind == "control":
        return _with_manifest(data, rng, _mutate_control_text)
    if kind == "long":
        return _with_manifest(data, rng, _mutate_long_strings)
    if kind == "nest":
        header, body = _split(data)
        meta = header.setdefault("__metadata__", {})
        depth = rng.choice([100, 2000, 50_000])
        if "manifest" in meta and rng.random() < 0.7:
            text = meta["manifest"]
            meta["manifest"] = text[:-1] + ',"deep":' + "[" * depth + "]" * depth + "}"
            return _join(header, body), f"manifest nested {depth} deep"
        raw = b'{"deep":' + b"[" * depth + b"]" * depth + b"}"
        raw += b" " * (-len(raw) % 8)
        return struct.pack("<Q", len(raw)) + raw + body, f"header nested {depth} deep"
    header, body = _split(data)
    what = _mutate_entries(header, rng)
    return _join(header, body), what


# --------------------------------------------------------------------------- consumers


def exercise(trace, path: Path, with_app: bool) -> None:
    """Everything a user can do with a loaded trace, headless (and in the app if asked)."""
    from tracing.analysis import report
    from tracing.errors import TraceFileError
    from tracing.file.loading import read_graph_data

    trace.graph  # noqa: B018
    for depth in range(5):
        trace.collapsed_graph(depth)
    for key in list(trace.values):
        with contextlib.suppress(TraceFileError):
            trace.values[key]
    with contextlib.suppress(TraceFileError):
        trace.attention_maps()
    for fmt in report.FORMATS:
        text = report.render(trace, fmt)
        text.encode("utf-8")
        assert "\x1b" not in text and "\x9b" not in text, f"raw ESC in the {fmt} report"
    with contextlib.suppress(TraceFileError):
        read_graph_data(path)
    if with_app:
        _exercise_app(path)


def _exercise_app(path: Path) -> None:
    """Open the file in the main window offscreen and step through it; an unexpected
    exception (a slot that raised, an error dialog titled "Unexpected error") fails."""
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from app.windows import dialogs
    from app.windows.main_window import MainWindow

    raised: list[str] = []
    sys.excepthook = lambda kind, value, tb: raised.append(
        "".join(traceback.format_exception(kind, value, tb))
    )
    shown: list[str] = []
    dialogs.show_error = lambda parent, title, text, details="": shown.append(f"{title}: {text}")
    dialogs.show_info = lambda *a, **k: None
    qt = QApplication.instance() or QApplication([])
    settings = QSettings(str(path.with_suffix(".ini")), QSettings.Format.IniFormat)
    window = MainWindow(settings=settings)
    window.show()
    window.open_path(path)
    n = len(window.trace.steps) if window.trace is not None else 0
    for step in sorted({0, n // 3, n // 2, n - 1} - {-1}):
        window.go_to(step)
        window.source_view.confirm_pending()  # the user asks for the named source file
        qt.processEvents()
    window.close()
    qt.processEvents()
    unexpected = [s for s in shown if s.startswith("Unexpected")]
    if raised or unexpected:
        raise AssertionError("the app raised:\n" + "\n".join(raised + unexpected))


# --------------------------------------------------------------------------- running a case


def _child(path: Path, with_app: bool, write_fd: int) -> None:
    """In the forked child: limits, then load and consume; report one JSON line."""
    import tracing
    from tracing.errors import TraceFileError

    with open("/proc/self/statm") as f:
        vm_pages = int(f.read().split()[0])
    limit = vm_pages * os.sysconf("SC_PAGE_SIZE") + MEMORY_LIMIT
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CPU, (TIME_LIMIT_S, TIME_LIMIT_S + 5))
    signal.alarm(TIME_LIMIT_S)
    try:
        try:
            trace = tracing.load(path)
        except TraceFileError as e:
            result = {"outcome": "error", "message": str(e)[:300]}
        else:
            exercise(trace, path, with_app)
            result = {"outcome": "loaded"}
    except BaseException as e:
        result = {
            "outcome": "failure",
            "message": f"{type(e).__name__}: {str(e)[:300]}",
            "traceback": traceback.format_exc()[-3000:],
        }
    os.write(write_fd, json.dumps(result).encode() + b"\n")
    os._exit(0)


def run_case(path: Path, with_app: bool) -> dict:
    """Fork a child for one file; a crash, a hang or no answer is a failure."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_fd)
        try:
            _child(path, with_app, write_fd)
        finally:
            os._exit(3)
    os.close(write_fd)
    chunks = []
    deadline = time.monotonic() + TIME_LIMIT_S + 10
    while time.monotonic() < deadline:
        ready, _, _ = select.select([read_fd], [], [], 0.5)
        if ready:
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    else:
        os.kill(pid, signal.SIGKILL)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    text = b"".join(chunks).decode("utf-8", "replace").strip()
    if text:
        return json.loads(text)
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        return {
            "outcome": "failure",
            "message": f"the child died by {name} (crash, timeout or memory)",
        }
    return {"outcome": "failure", "message": f"the child gave no answer (status {status})"}


def fuzz(cases: int, seed: int = 0, app_cases: int = 20, folder: Path | None = None) -> dict:
    """Run ``cases`` mutated files; ``app_cases`` of those that load also go through the
    app. Returns counts and the failures (with the mutation and a reproducer path)."""
    import torch

    torch.set_num_threads(1)
    import app.windows.main_window  # noqa: F401 - imported once, before forking

    own = folder is None
    folder = Path(tempfile.mkdtemp(prefix="scratchformer-fuzz-")) if own else folder
    seeds = [(p, p.read_bytes()) for p in make_seeds(folder)]
    rng = random.Random(seed)
    counts: Counter = Counter()
    failures = []
    app_left = app_cases
    start = time.perf_counter()
    for case in range(cases):
        seed_path, data = seeds[case % len(seeds)]
        mutated, what = mutate(data, rng)
        path = folder / f"case{case:05d}.sft"
        path.write_bytes(mutated)
        result = run_case(path, with_app=False)
        if result["outcome"] == "loaded" and app_left > 0:
            app_left -= 1
            counts["app"] += 1
            result = run_case(path, with_app=True)
        counts[result["outcome"]] += 1
        if result["outcome"] == "failure":
            failures.append({"case": case, "seed": seed_path.name, "mutation": what,
                             "file": str(path), **result})  # fmt: skip
        else:
            path.unlink()
    counts["cases"] = cases
    if own and not failures:  # failing files stay, for reproduction
        shutil.rmtree(folder, ignore_errors=True)
    return {"counts": dict(counts), "failures": failures, "seconds": time.perf_counter() - start}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=int(os.environ.get(CASES_VARIABLE, 300)))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--app-cases", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    result = fuzz(args.cases, args.seed, args.app_cases)
    if args.json:
        print(json.dumps(result))
    else:
        c = result["counts"]
        print(
            f"{c['cases']} cases in {result['seconds']:.1f} s: {c.get('error', 0)} clean errors, "
            f"{c.get('loaded', 0)} loaded ({c.get('app', 0)} also in the app), "
            f"{c.get('failure', 0)} failures"
        )
        for f in result["failures"]:
            print(f"  case {f['case']} ({f['seed']}, {f['mutation']}): {f['message']}")
            print("   ", f.get("traceback", "").strip().replace("\n", "\n    ")[-1500:])
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
