"""The pool of idle value chunks (``tracing/capture/value_sinks.py``): trimmed past its
limit without comparing chunks by value (``list.remove`` did, and two chunks of one size
made ``==`` a tensor: the backward of a ``values`` training step on gpt2-small died)."""

from __future__ import annotations

import torch

from tracing.capture import value_sinks


def test_idle_chunks_beyond_the_limit_are_dropped_newest_kept(monkeypatch):
    chunks = [torch.zeros(64, dtype=torch.uint8) for _ in range(5)]
    monkeypatch.setattr(value_sinks, "_POOL", list(chunks))
    monkeypatch.setattr(value_sinks, "POOL_IDLE_BYTES", 3 * 64)
    value_sinks._trim_pool()
    kept = value_sinks._POOL
    assert [id(c) for c in kept] == [id(c) for c in chunks[2:]]  # the 3 newest


def test_a_chunk_still_in_use_is_never_dropped(monkeypatch):
    chunks = [torch.zeros(64, dtype=torch.uint8) for _ in range(4)]
    in_use = chunks[0][:8]  # a copy made in the oldest chunk is alive
    monkeypatch.setattr(value_sinks, "_POOL", list(chunks))
    monkeypatch.setattr(value_sinks, "POOL_IDLE_BYTES", 64)
    value_sinks._trim_pool()
    assert [id(c) for c in value_sinks._POOL] == [id(chunks[0]), id(chunks[3])]
    assert in_use.numel() == 8


def test_taking_a_chunk_past_the_limit_trims_the_pool(monkeypatch):
    chunks = [torch.zeros(64, dtype=torch.uint8) for _ in range(4)]
    monkeypatch.setattr(value_sinks, "_POOL", list(chunks))
    monkeypatch.setattr(value_sinks, "POOL_IDLE_BYTES", 2 * 64)
    monkeypatch.setattr(value_sinks, "CHUNK_BYTES", 256)
    got = value_sinks._take_chunk(128, pinned=False)  # none of 64 bytes is big enough
    assert got.numel() == 256
    assert [id(c) for c in value_sinks._POOL] == [id(c) for c in chunks[2:]]
