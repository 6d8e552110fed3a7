"""What the per-entry CRC-32 of a trace file costs, on a big ``values`` trace.

    PYTHONPATH=$PWD python benchmarks/bench_checksum.py --tokens 256 --rounds 3

Traces the gpt2-small preset (random weights) at ``--tokens`` tokens at ``values``, saves
it once, then times, interleaved round by round:

- reading every value with checksums verified, against the same reads with verification
  switched off (the checksums dropped from the open file's entries), and against a plain
  ``safetensors`` read (``load_file`` and a copy of every tensor out of its memory map,
  as ``scratchformer bench`` measures it);
- saving (the writer computes the CRC as it writes), against a plain
  ``safetensors.torch.save_file`` of the same tensors;
- opening lazily (header only), which must stay fast whatever the file's size.

Prints medians and ratios, and the CRC-32's speed (``tracing.crc32``: the zlib-ng wheel,
against zlib): the least a verified read can take on two cores is about the
plain read plus half the CRC-32's time, which bounds the ratio ``scratchformer bench``
can reach while every value is checked. It never fails.

Figures measured here before, quoted from the code they explain (2-core EPYC, the 471 MB
gpt2-small ``values`` trace, every tensor read once; rerun to check them):

- ``tracing/file/container.py``: ~56 ms without checksums, ~75 ms with; the CRC-32 is
  ~34 ms of CPU at libdeflate's 14 GB/s (~16 ms at zlib-ng's 30), split over the two
  cores; reading ahead the next entry on the helper thread measured no better (both
  cores are busy already);
- ``tracing/file/crc32.py``: ``zlib.crc32`` ~4 GB/s per core, libdeflate (found by
  ``ctypes``, before) ~14 GB/s, the zlib-ng wheel (now) ~30 GB/s, in the same runs
  interleaved; a ``combiner`` append ~0.2 us instead of ~4 for ``combine``, its tables
  ~0.3 ms.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
import zlib
from pathlib import Path

import torch

import tracing
from tracing.file import crc32
from tracing.file.saving import tensors_to_store


def _read_all(path: Path, verify: bool) -> float:
    trace = tracing.load(path)
    container = trace.values._handle
    if not verify:
        for name, entry in list(container.entries.items()):
            container.entries[name] = entry._replace(checksum=None)
    start = time.perf_counter()
    for key in trace.values:
        trace.values[key]
    elapsed = time.perf_counter() - start
    trace.values.close()
    return elapsed


def _read_plain(path: Path) -> float:
    from safetensors.torch import load_file

    start = time.perf_counter()
    for t in load_file(str(path)).values():
        t.clone()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tmp", default=None, help="folder for the files (default: system)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from scratchformer import DecoderOnlyTransformer, ModelConfig

    torch.manual_seed(0)
    model = DecoderOnlyTransformer(ModelConfig.preset("gpt2-small")).eval()
    ids = torch.randint(0, 50257, (1, args.tokens), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        trace = tracing.trace(model, ids, capture="values")
    del model
    gc.collect()

    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        path, plain = Path(tmp) / "big.sft", Path(tmp) / "plain.safetensors"
        start = time.perf_counter()
        trace.save(path)
        first_save = time.perf_counter() - start
        size = path.stat().st_size
        print(f"gpt2-small, {args.tokens} tokens, values: file {size / 1e9:.2f} GB, "
              f"{len(trace.values)} tensors, first save {first_save:.1f} s")  # fmt: skip

        from safetensors.torch import save_file

        stored = tensors_to_store(trace, plain)
        data = torch.cat([t.reshape(-1).view(torch.uint8) for t in stored.values()])
        start = time.perf_counter()
        zlib.crc32(data.numpy())
        zlib_s = time.perf_counter() - start
        start = time.perf_counter()
        crc32.crc32(data.numpy())
        crc_s = time.perf_counter() - start
        print(f"  crc32 over all {data.numel() / 1e9:.2f} GB in memory, one thread: "
              f"{crc32.implementation()} {crc_s * 1e3:.0f} ms "
              f"({data.numel() / crc_s / 1e9:.1f} GB/s), zlib {zlib_s * 1e3:.0f} ms "
              f"({data.numel() / zlib_s / 1e9:.1f} GB/s)")  # fmt: skip
        del data

        verified, unverified, plain_reads, ours, theirs, opens = [], [], [], [], [], []
        save_file(stored, str(plain))
        for round_ in range(args.rounds):
            order = [True, False, None] if round_ % 2 == 0 else [None, False, True]
            for verify in order:
                gc.collect()
                if verify is None:
                    plain_reads.append(_read_plain(plain))
                else:
                    (verified if verify else unverified).append(_read_all(path, verify))
            gc.collect()
            start = time.perf_counter()
            trace.save(path)
            ours.append(time.perf_counter() - start)
            gc.collect()
            start = time.perf_counter()
            save_file(stored, str(plain))
            theirs.append(time.perf_counter() - start)
            start = time.perf_counter()
            tracing.load(path).values.close()
            opens.append(time.perf_counter() - start)

        def med(xs: list[float]) -> float:
            return statistics.median(xs)

        v, u, p = med(verified), med(unverified), med(plain_reads)
        print(f"  read every value: verified {v * 1e3:.0f} ms, unverified {u * 1e3:.0f} ms, "
              f"plain safetensors {p * 1e3:.0f} ms -> plain/verified {p / v:.2f}x, "
              f"plain/unverified {p / u:.2f}x")  # fmt: skip
        floor = p + crc_s / 2
        print(f"  a verified read takes at least the plain read plus half the CRC-32 "
              f"(two cores): {floor * 1e3:.0f} ms -> plain/verified <= "
              f"{p / floor:.2f}x")  # fmt: skip
        floor = u + crc_s / 2
        print(f"  ...and with pread (never a memory map), the unverified read plus half the "
              f"CRC-32: {floor * 1e3:.0f} ms -> plain/verified <= {p / floor:.2f}x")  # fmt: skip
        print(f"  save (crc while writing) {med(ours):.2f} s vs plain safetensors "
              f"{med(theirs):.2f} s -> {med(ours) / med(theirs):.2f}x")  # fmt: skip
        print(f"  lazy open {med(opens) * 1e3:.1f} ms (median of {args.rounds})")


if __name__ == "__main__":
    main()
