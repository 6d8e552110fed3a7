"""The trace file: round trip, laziness, atomic writes, and one clear error per bad file."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest
import torch
from helpers.golden.handmade import handmade_trace
from helpers.trace_files import expect_error, rewrite, same_tensor
from safetensors import safe_open
from safetensors.torch import save_file

import tracing
from tracing import file as trace_file
from tracing.errors import TraceFileError
from tracing.file import lazy_values, saving
from tracing.file.manifest import json_default
from tracing.record import SCHEMA_VERSION, Trace

# --------------------------------------------------------------------------- helpers


def assert_same_trace(a: Trace, b: Trace) -> None:
    assert a.steps == b.steps
    assert a.tensors == b.tensors
    assert a.modules == b.modules
    assert list(a.modules) == list(b.modules)  # order too
    assert a.meta == b.meta
    assert a.error == b.error
    assert set(a.values) == set(b.values)
    for key in a.values:
        assert same_tensor(a.values[key], b.values[key]), key


def manifest_of(path: Path) -> dict:
    with safe_open(str(path), framework="pt") as f:
        return json.loads(f.metadata()["manifest"])


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Trace, Path]:
    trace = handmade_trace()
    path = tmp_path / "toy.sft"
    trace.save(path)
    return trace, path


# --------------------------------------------------------------------------- round trip


def test_save_then_load_gives_an_equal_trace(saved):
    trace, path = saved
    loaded = tracing.load(path)
    assert_same_trace(trace, loaded)
    # types survive exactly: tuples stay tuples, None stays None
    assert isinstance(loaded.steps[7].inputs, tuple)
    assert loaded.steps[0].source is None
    assert loaded.tensors[7].dims is None
    assert loaded.tensors[6].shape == ()
    assert isinstance(loaded.meta["shape_tuple"], tuple)
    assert loaded.tensors[5].stats.nan == 1 and loaded.tensors[5].stats.inf == 1


def test_stats_level_trace_round_trips(tmp_path):
    trace = handmade_trace(with_values=False)
    trace.error = "ValueError: boom"
    trace.save(tmp_path / "s.sft")
    loaded = tracing.load(tmp_path / "s.sft")
    assert_same_trace(trace, loaded)
    assert not loaded.complete


def test_empty_trace_round_trips(tmp_path):
    trace = Trace(meta={"note": "nothing ran"})
    trace.save(tmp_path / "e.sft")
    assert_same_trace(trace, tracing.load(tmp_path / "e.sft"))


def test_values_with_awkward_layouts_round_trip(tmp_path):
    trace = handmade_trace()
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    extra = {
        "slice": base[1:3, ::2],  # non-contiguous view into another stored tensor's memory
        "base": base,
        "alias": base,  # the same tensor under two keys
        "bf16": torch.linspace(0, 1, 7, dtype=torch.bfloat16),
        "bool": torch.tensor([True, False, True]),
    }
    trace.values = {**trace.values, **extra}
    trace.save(tmp_path / "a.sft")
    loaded = tracing.load(tmp_path / "a.sft")
    for key, value in extra.items():
        assert same_tensor(loaded.values[key], value.contiguous()), key


def test_file_is_a_plain_safetensors_file_with_a_manifest(saved):
    trace, path = saved
    with safe_open(str(path), framework="pt") as f:
        header = f.metadata()
        assert set(f.keys()) == set(trace.values)
    assert header["format"] == "scratchformer-trace"
    assert header["schema"] == str(SCHEMA_VERSION)
    manifest = json.loads(header["manifest"])
    assert manifest["schema"] == SCHEMA_VERSION
    assert len(manifest["steps"]["rows"]) == len(trace.steps)
    assert b"pickle" not in path.read_bytes()


def test_graph_is_stored_as_node_link_data(saved):
    pytest.importorskip("tracing.graph")
    import networkx as nx

    trace, path = saved
    stored = trace_file.read_graph_data(path)
    expected = json.loads(
        json.dumps(nx.node_link_data(trace.graph, edges="edges"), default=json_default)
    )
    assert stored == expected
    assert "edges" in stored and "links" not in stored
    rebuilt = nx.node_link_graph(stored, edges="edges")
    assert sorted(rebuilt.edges) == sorted(trace.graph.edges)
    assert rebuilt.number_of_nodes() == len(trace.steps)


def test_big_manifest_goes_into_a_tensor(tmp_path, monkeypatch):
    monkeypatch.setattr(saving, "MANIFEST_INLINE_LIMIT", 10)
    trace = handmade_trace()
    trace.save(tmp_path / "big.sft")
    with safe_open(str(tmp_path / "big.sft"), framework="pt") as f:
        assert "manifest" not in f.metadata() and "graph" not in f.metadata()
    loaded = tracing.load(tmp_path / "big.sft")
    assert_same_trace(trace, loaded)
    assert trace_file.MANIFEST_TENSOR not in loaded.values
    assert trace_file.GRAPH_TENSOR not in loaded.values
    assert trace_file.read_graph_data(tmp_path / "big.sft")["edges"]


def test_downcast_values_are_accepted_when_meta_says_so(tmp_path):
    trace = handmade_trace()
    trace.values = {k: (v.half() if v.is_floating_point() else v) for k, v in trace.values.items()}
    trace.save(tmp_path / "h.sft")
    expect_error(tmp_path / "h.sft", "stored as float16")
    trace.meta["value_dtype"] = "float16"
    trace.save(tmp_path / "h.sft")
    assert tracing.load(tmp_path / "h.sft").values["t1"].dtype == torch.float16


@pytest.mark.parametrize("chunk", [64, 1 << 24])
def test_writer_output_is_read_back_exactly_by_safetensors_itself(tmp_path, monkeypatch, chunk):
    """Views, strides, offsets and shared memory, through the block-by-block path too."""
    from safetensors.torch import load_file

    monkeypatch.setattr(saving, "WRITE_CHUNK_BYTES", chunk)
    base = torch.arange(2 * 3 * 5 * 7, dtype=torch.float32).reshape(2, 3, 5, 7)
    tensors = {
        "transposed": base.transpose(1, 2),  # (2, 5, 3, 7), non-contiguous
        "permuted": base.permute(3, 1, 0, 2),
        "strided_1d": base.reshape(-1)[::3],
        "offset_view": base[1, 2],  # contiguous, storage offset != 0
        "whole": base,  # shares memory with every view above
        "half": torch.linspace(-1, 1, 9, dtype=torch.float16),
        "bf16": torch.linspace(-1, 1, 5, dtype=torch.bfloat16),
        "flags": torch.tensor([True, False, True]),
        "ids": torch.tensor([[3, 1], [4, 1]], dtype=torch.int64),
        "bytes": torch.arange(7, dtype=torch.uint8),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 4),
    }
    path = tmp_path / "w.safetensors"
    trace_file.write_safetensors(tensors, path, {"k": "v"})
    back = load_file(str(path))
    assert set(back) == set(tensors)
    for key, t in tensors.items():
        assert same_tensor(back[key], t.contiguous()), key
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata()
    checksums = json.loads(metadata.pop("checksums"))
    assert metadata == {"k": "v"}
    # each entry's CRC-32, against zlib over the bytes safetensors itself reads back
    assert checksums["algorithm"] == "crc32"
    assert checksums["entries"] == {
        key: f"{zlib.crc32(back[key].contiguous().view(-1).view(torch.uint8).numpy()):08x}"
        for key in tensors
    }
    (header_len,) = struct.unpack("<Q", path.read_bytes()[:8])
    assert header_len % 8 == 0


# --------------------------------------------------------------------------- laziness


def test_values_load_lazily_and_are_read_only(saved):
    trace, path = saved
    loaded = tracing.load(path)
    values = loaded.values
    assert isinstance(values, trace_file.LazyValues)
    assert len(values._cache) == 0  # opening read no tensor data
    assert "t3" in values and "nope" not in values
    assert same_tensor(loaded.value(3), trace.values["t3"])
    assert list(values._cache) == ["t3"]
    with pytest.raises(TypeError):
        values["t3"] = torch.zeros(1)  # type: ignore[index]
    with pytest.raises(KeyError):
        values["nope"]


def test_cache_keeps_only_the_most_recent_tensors(saved, monkeypatch):
    _, path = saved
    monkeypatch.setattr(lazy_values, "VALUE_CACHE_SIZE", 2)
    values = tracing.load(path).values
    for key in ("t0", "t1", "t2", "t1"):
        values[key]
    assert list(values._cache) == ["t2", "t1"]


def test_cache_is_bounded_in_bytes_too(saved, monkeypatch):
    _, path = saved
    monkeypatch.setattr(lazy_values, "VALUE_CACHE_BYTES", 60)  # t1 is 48 bytes, t3 is 72
    values = tracing.load(path).values
    values["t1"]
    values["t2"]
    assert list(values._cache) == ["t2"]  # 48 + 48 > 60
    values["t3"]
    assert list(values._cache) == ["t3"]  # the last one read stays even when over budget


def test_opening_does_not_read_tensor_data(saved):
    """Scribbling over the data section leaves opening (header only) unaffected."""
    trace, path = saved
    raw = bytearray(path.read_bytes())
    (header_len,) = struct.unpack("<Q", raw[:8])
    start = 8 + header_len
    raw[start:] = b"\xff" * (len(raw) - start)
    path.write_bytes(bytes(raw))
    loaded = tracing.load(path)
    assert loaded.steps == trace.steps
    # ...and reading a scribbled value is caught by its checksum, not returned as data
    with pytest.raises(TraceFileError, match="'t1' fails its checksum"):
        loaded.values["t1"]


# --------------------------------------------------------------------------- writing


def test_interrupted_save_leaves_the_old_file_and_no_partial_one(saved, monkeypatch):
    trace, path = saved
    before = path.read_bytes()

    def exploding_write(tensors, filename, metadata):
        Path(filename).write_bytes(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(saving, "write_safetensors", exploding_write)
    with pytest.raises(KeyboardInterrupt):
        trace.save(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_save_into_a_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(TraceFileError, match="does not exist"):
        handmade_trace().save(tmp_path / "no" / "such" / "x.sft")


def test_save_refuses_an_inconsistent_trace(tmp_path):
    trace = handmade_trace()
    trace.steps[3] = trace.steps[3].__class__(**{**trace.steps[3].__dict__, "inputs": (99,)})
    with pytest.raises(TraceFileError, match=r"steps\[3\]: input tensor id 99 is out of range"):
        trace.save(tmp_path / "x.sft")
    assert not (tmp_path / "x.sft").exists()


def test_save_returns_the_path_and_accepts_str(tmp_path):
    out = trace_file.save(handmade_trace(), str(tmp_path / "x.sft"))
    assert out == tmp_path / "x.sft" and out.exists()


# --------------------------------------------------------------------------- bad files


def test_missing_file(tmp_path):
    expect_error(tmp_path / "absent.sft", "no such file")


def test_truncated_file(saved):
    _, path = saved
    data = path.read_bytes()
    for cut in (len(data) - 7, len(data) // 2, 20, 3, 0):
        path.write_bytes(data[:cut])
        expect_error(path, "truncated")


def test_not_a_safetensors_file(tmp_path):
    path = tmp_path / "notes.sft"
    path.write_text("these are some notes, not tensors at all\n" * 10)
    expect_error(path, "safetensors")


def test_foreign_safetensors_file(tmp_path):
    path = tmp_path / "weights.safetensors"
    save_file({"weight": torch.zeros(2, 2)}, str(path), metadata={"format": "pt"})
    expect_error(path, "not a Scratchformer trace")


def test_newer_schema_version(saved):
    _, path = saved
    rewrite(path, lambda m: None, schema=str(SCHEMA_VERSION + 1))
    expect_error(path, f"schema version {SCHEMA_VERSION + 1}", "upgrade")


def test_invalid_json_manifest(saved):
    _, path = saved
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        header = dict(f.metadata())
    header["manifest"] = header["manifest"][:-10]
    save_file(tensors, str(path), metadata=header)
    expect_error(path, "not valid JSON")


def test_manifest_naming_a_missing_tensor(saved):
    _, path = saved
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if k != "t4"}  # noqa: SIM118
        header = dict(f.metadata())
    save_file(tensors, str(path), metadata=header)
    expect_error(path, "'t4'", "not in the file")


def _edit_tensor(index: int, field: str, value):
    def edit(m):
        names = m["tensors"]["fields"]
        m["tensors"]["rows"][index][names.index(field)] = value

    return edit


def _edit_step(index: int, field: str, value):
    def edit(m):
        names = m["steps"]["fields"]
        m["steps"]["rows"][index][names.index(field)] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (_edit_tensor(1, "shape", [1, 3, 5]), ("'t1'", "shape [1, 3, 4]", "[1, 3, 5]")),
        (_edit_tensor(1, "dtype", "float64"), ("'t1'", "stored as float32", "float64")),
        (_edit_tensor(2, "producer", 500), ("tensor record 2", "producer steps[500]")),
        (_edit_tensor(2, "shape", "big"), ("tensor record 2", "shape")),
        (_edit_tensor(2, "dims", ["B", "T"]), ("tensor record 2", "2 axis names for 4 axes")),
        (_edit_step(5, "inputs", [1, 42]), ("steps[5]", "input tensor id 42 is out of range")),
        (_edit_step(5, "outputs", [-1]), ("steps[5]", "output tensor id -1")),
        (_edit_step(5, "parent", 12), ("steps[5]", "parent steps[12] is out of range")),
        (_edit_step(5, "module", "blocks.7.attn"), ("steps[5]", "'blocks.7.attn'")),
        (_edit_step(5, "kind", "magic"), ("steps[5]", "'magic'")),
        (_edit_step(5, "source", 99), ("steps[5]", "source 99")),
        (_edit_step(5, "index", 6), ("steps[5] has index 6",)),
        (lambda m: m["modules"]["rows"][1].__setitem__(2, "ghost"), ("unknown parent 'ghost'",)),
        (lambda m: m["steps"]["rows"][0].pop(), ("row 0 of the steps table",)),
        (lambda m: m.pop("tensors"), ("no tensors table",)),
    ],
)
def test_inconsistent_manifest(saved, edit, words):
    _, path = saved
    rewrite(path, edit)
    expect_error(path, *words)


def test_unknown_fields_from_a_compatible_writer_are_ignored(saved):
    trace, path = saved

    def add_field(m):
        m["steps"]["fields"].append("colour")
        for row in m["steps"]["rows"]:
            row.append("blue")

    rewrite(path, add_field)
    assert tracing.load(path).steps == trace.steps


def test_a_folder_is_not_a_trace_file(tmp_path):
    expect_error(tmp_path, "folder")
