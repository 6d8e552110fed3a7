"""Hostile trace files: each is refused with one ``TraceFileError`` naming the problem,
or opens and then reads safely. (The seeded fuzz run is ``test_fuzz_trace_files.py``.)"""

from __future__ import annotations

import json
import os
import shutil
import struct
import threading
from pathlib import Path

import pytest
import torch
from helpers.golden.handmade import handmade_trace
from helpers.trace_files import expect_error, rewrite, same_tensor
from safetensors import safe_open
from safetensors.torch import save_file

import tracing
from tracing.errors import TraceFileError


@pytest.fixture
def saved(tmp_path: Path) -> tuple:
    trace = handmade_trace()
    path = tmp_path / "toy.sft"
    trace.save(path)
    return trace, path


def _step(index: int, field: str, value):
    def edit(m):
        m["steps"]["rows"][index][m["steps"]["fields"].index(field)] = value

    return edit


def _edit_header(path: Path, edit) -> None:
    """Rewrite the safetensors header in place, padded to its old length (the data stays
    where it was); ``edit(header)`` mutates the parsed header."""
    raw = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    edit(header)
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= n
    path.write_bytes(raw[:8] + text + b" " * (n - len(text)) + raw[8 + n :])


# --------------------------------------------------------------------------- structure


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (_step(5, "parent", 5), ("steps[5]", "parent steps[5] does not come before it")),
        (_step(2, "parent", 9), ("steps[2]", "parent steps[9] does not come before it")),
        (_step(2, "parent", 0), ("steps[2]", "parent steps[0]", "depth")),
        (_step(5, "parent", 2), ("steps[5]", "parent steps[2] is not a module call")),
        (_step(2, "depth", 7), ("steps[2] has depth 7",)),
        (_step(0, "depth", 10**400), ("steps[0]", "depth")),
        (_step(1, "end", 0), ("steps[1] ends at steps[0]",)),
        (_step(1, "end", 1), ("steps[2] lies after the end (1) of its parent steps[1]",)),
        (lambda m: m.__setitem__("stats_fields", [[1], {}]), ("stats_fields",)),
        (
            lambda m: m["tensors"]["rows"][1].__setitem__(
                m["tensors"]["fields"].index("stats"), [10**400, 0, 0, 0, 0, 0]
            ),
            ("tensor record 1", "stats"),
        ),
        (lambda m: m["meta"].__setitem__("x", {"__items__": [[1, 2, 3]]}), ("not a pair",)),
        (lambda m: m["meta"].__setitem__("x", {"__items__": [[{"a": 1}, 2]]}), ("key",)),
        (lambda m: m["meta"].__setitem__("x", {"__items__": "no"}), None),  # loads: a dict
    ],
)
def test_structural_problems_are_one_clear_error(saved, edit, words):
    _, path = saved
    if words is None:  # not a problem: an ordinary dict key named __items__
        rewrite(path, edit)
        assert tracing.load(path).meta["x"] == {"__items__": "no"}
        return
    rewrite(path, edit)
    expect_error(path, *words)


def test_a_downcast_to_a_non_float_dtype_is_refused(saved):
    """meta.value_dtype may only name a floating dtype: int64 bytes are not a float32 map."""
    _, path = saved
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        header = dict(f.metadata())
    tensors["t1"] = tensors["t1"].long()
    manifest = json.loads(header["manifest"])
    manifest["meta"]["value_dtype"] = "int64"
    header["manifest"] = json.dumps(manifest)
    del header["checksums"]
    save_file(tensors, str(path), metadata=header)
    expect_error(path, "'t1'", "stored as int64", "float32")


@pytest.mark.parametrize("depth", [200, 5000])
def test_deep_nesting_in_meta_or_anywhere_is_refused(saved, depth):
    _, path = saved
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        header = dict(f.metadata())
    manifest = header["manifest"]
    header["manifest"] = manifest[:-1] + ',"deep":' + "[" * depth + "]" * depth + "}"
    if depth == 200:  # inside meta, within what JSON parses
        m = json.loads(manifest)
        m["meta"]["deep"] = json.loads("[" * depth + "]" * depth)
        header["manifest"] = json.dumps(m)
    save_file(tensors, str(path), metadata=header)
    expect_error(path, "nested")


def test_a_manifest_entry_that_is_not_bytes_is_refused(saved, monkeypatch):
    trace, path = saved
    from tracing.file import saving

    monkeypatch.setattr(saving, "MANIFEST_INLINE_LIMIT", 10)
    trace.save(path)
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        header = dict(f.metadata())
    raw = tensors["__scratchformer_manifest__"]
    tensors["__scratchformer_manifest__"] = raw[: len(raw) // 2 * 2].view(torch.bfloat16)
    del header["checksums"]
    save_file(tensors, str(path), metadata=header)
    expect_error(path, "__scratchformer_manifest__", "uint8")


def test_an_entry_dtype_this_reader_does_not_know_is_refused(saved):
    """F4/F6 entries (sub-byte floats) would be read with the wrong size; refuse them."""
    _, path = saved
    _edit_header(path, lambda h: h["t1"].__setitem__("dtype", "F4"))
    expect_error(path, "'t1'", "dtype 'F4'")


def test_entry_sizes_must_agree_with_their_bytes(saved):
    _, path = saved
    # half the elements its 48 bytes hold
    _edit_header(path, lambda h: h["t1"].__setitem__("shape", [1, 3, 2]))
    expect_error(path, "'t1'", "needs 24 bytes", "span 48")


def test_swapped_data_offsets_fail_the_checksum_on_read(saved):
    trace, path = saved

    def swap(header):
        t1, t4 = header["t1"], header["t4"]
        t1["data_offsets"], t4["data_offsets"] = t4["data_offsets"], t1["data_offsets"]

    _edit_header(path, swap)
    loaded = tracing.load(path)  # same shapes and dtypes: the layout is valid
    with pytest.raises(TraceFileError, match="'t1' fails its checksum"):
        loaded.values["t1"]
    assert torch.equal(loaded.values["t3"], trace.values["t3"])  # the others read fine


def test_a_file_without_checksums_still_opens(saved):
    """Files from before checksums (or from any safetensors writer) open unverified."""
    trace, path = saved
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        header = dict(f.metadata())
    del header["checksums"]
    save_file(tensors, str(path), metadata=header)
    loaded = tracing.load(path)
    for key in trace.values:
        assert same_tensor(loaded.values[key], trace.values[key].contiguous())


def test_manifest_size_and_row_caps(saved, monkeypatch):
    from tracing.file import loading, validate

    _, path = saved
    monkeypatch.setattr(validate, "MAX_RECORDS", 5)
    expect_error(path, "more than 5")
    monkeypatch.setattr(loading, "MAX_MANIFEST_BYTES", 100)
    expect_error(path, "manifest is longer than the 100")


def test_header_entry_cap(saved, monkeypatch):
    from tracing.file import container

    _, path = saved
    monkeypatch.setattr(container, "MAX_ENTRIES", 3)
    expect_error(path, "more than 3 entries")


# --------------------------------------------------------------------------- files


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.sft"
    os.mkfifo(fifo)
    result: list = []
    worker = threading.Thread(target=lambda: result.append(_load_error(fifo)), daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "load blocked on a FIFO"
    assert "FIFO" in result[0] and "refused" in result[0]


def test_a_device_file_is_refused():
    assert "device" in _load_error(Path("/dev/zero"))


def test_a_path_the_os_cannot_take_is_one_error(tmp_path):
    assert "cannot read" in _load_error(tmp_path / ("x" * 300))
    assert "cannot read" in _load_error(tmp_path / "a\0b")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may enter any folder")
def test_a_folder_it_may_not_enter(tmp_path):  # pragma: no cover - not run as root
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "x.sft").write_bytes(b"")
    locked.chmod(0)
    try:
        assert "denied" in _load_error(locked / "x.sft")
    finally:
        locked.chmod(0o700)


def _load_error(path: Path) -> str:
    with pytest.raises(TraceFileError) as info:
        tracing.load(path)
    return str(info.value)


# --------------------------------------------------------------------------- changed underneath


def test_a_file_overwritten_under_an_open_trace_is_an_error_not_a_crash(saved, tmp_path):
    """``cp other.sft open.sft`` rewrites the same inode: a memory map would SIGBUS."""
    _, path = saved
    other = tmp_path / "other.sft"
    small = handmade_trace()
    small.values = {k: v for k, v in small.values.items() if k == "t3"}
    small.tensors = [
        r if r.value_key == "t3" else r.__class__(**{**r.__dict__, "value_key": None})
        for r in small.tensors
    ]
    small.save(other)
    loaded = tracing.load(path)
    shutil.copyfile(other, path)  # truncates, then writes a shorter file in place
    with pytest.raises(TraceFileError, match="changed on disk"):
        loaded.values["t5"]


def test_a_file_truncated_under_an_open_trace_is_an_error(saved):
    _, path = saved
    loaded = tracing.load(path)
    os.truncate(path, 100)
    with pytest.raises(TraceFileError, match="changed on disk"):
        loaded.values["t1"]


def test_a_file_replaced_by_rename_keeps_reading_the_opened_one(saved, tmp_path):
    trace, path = saved
    loaded = tracing.load(path)
    other = tmp_path / "other.sft"
    other.write_bytes(b"not a trace")
    os.replace(other, path)
    assert same_tensor(loaded.values["t5"], trace.values["t5"])


# --------------------------------------------------------------------------- unusual dtypes


def test_a_complex128_trace_saves_without_those_values_and_says_so(tmp_path):
    """safetensors has no complex128: the trace is saved anyway, those values left out
    (shape and stats kept) and a note in meta saying so."""

    class Rotate(torch.nn.Module):
        def forward(self, x):
            return (x * 1j).exp() + x

    model = Rotate()
    x = torch.randn(2, 3, dtype=torch.complex128)
    trace = tracing.trace(model, x, capture="values")
    assert any(r.value_key for r in trace.tensors if r.dtype == "complex128")
    path = tmp_path / "complex.sft"
    trace.save(path)
    loaded = tracing.load(path)
    assert [r.shape for r in loaded.tensors] == [r.shape for r in trace.tensors]
    assert all(r.value_key is None for r in loaded.tensors if r.dtype == "complex128")
    assert "complex128" in loaded.meta["notes"][-1] and "not saved" in loaded.meta["notes"][-1]
    assert "notes" not in trace.meta  # the trace in memory is unchanged


def test_writing_never_replaces_a_device_or_a_fifo(tmp_path):
    """Saving over /dev/null or a FIFO must not rename a plain file over it (as root that
    would turn /dev/null into a regular file for the whole machine)."""
    import stat

    from tracing.analysis import report

    trace = tracing.trace(torch.nn.Linear(2, 2), torch.randn(1, 2))
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(tracing.TraceFileError, match="not a regular file"):
        trace.save(fifo)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    report.write(trace, os.devnull, "md")  # written into the device, not renamed over it
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_the_column_check_agrees_with_check_trace_record_by_record():
    """``load`` decides on whole columns whether the cross-references hold and runs the
    record-by-record ``check_trace`` only to name a problem: both must agree on every
    broken reference (a bad file that the column check passed would open)."""
    import random
    from dataclasses import fields, replace

    from torch import nn

    from tracing.file import manifest
    from tracing.file.layout import Invalid
    from tracing.runs.backward import trace_step

    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    trace = trace_step(model, torch.randn(2, 4), lambda out: out.sum(), capture="stats")
    assert any(s.kind == "backward" for s in trace.steps) and trace.modules

    def columns(records):
        return {f.name: [getattr(r, f.name) for r in records] for f in fields(records[0])}

    def agree(steps, tensors) -> bool:
        broken = replace(trace, steps=steps, tensors=tensors)
        try:
            manifest.check_trace(broken)
            passes = True
        except Invalid:
            passes = False
        assert manifest.consistent(columns(steps), columns(tensors), trace.modules) == passes
        return passes

    assert agree(trace.steps, trace.tensors)
    n_steps, n_tensors = len(trace.steps), len(trace.tensors)
    rng = random.Random(0)
    failed = 0
    for _ in range(600):
        steps, tensors = list(trace.steps), list(trace.tensors)
        if rng.random() < 0.6:
            i = rng.randrange(n_steps)
            name = rng.choice(["index", "parent", "end", "forward", "depth", "inputs",
                               "outputs", "module", "kind"])  # fmt: skip
            n = n_tensors if name in ("inputs", "outputs") else n_steps
            value = rng.choice([None, -1, 0, 1, i - 1, i, i + 1, n - 1, n, 2**62, 256, 257])
            if name in ("inputs", "outputs"):
                value = (rng.choice([-1, 0, n - 1, n]),)
            if name == "module":
                value = rng.choice(["", "0", "nope"])
            if name == "kind":
                value = rng.choice(["module", "op", "backward", "other"])
            if name in ("index", "depth") and value is None:
                value = 0
            steps[i] = replace(steps[i], **{name: value})
        else:
            i = rng.randrange(n_tensors)
            name = rng.choice(["id", "producer", "grad_of", "dims"])
            n = n_steps if name == "producer" else n_tensors
            value = rng.choice([None, -1, 0, i, n - 1, n, 2**62])
            if name == "id" and value is None:
                value = i + 1
            if name == "dims":
                value = rng.choice([None, (), ("B",) * len(tensors[i].shape), ("B",) * 9])
            tensors[i] = replace(tensors[i], **{name: value})
        failed += not agree(steps, tensors)
    assert failed > 200  # most edits break a rule: both checks saw them
