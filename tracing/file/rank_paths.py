"""File names of a trace per rank: ``trace.sft`` -> ``trace.rank0.sft``, ``trace.rank1.sft``."""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path


def group_ready() -> bool:
    """True inside an initialized default process group."""
    import torch.distributed as dist  # here: naming a rank's file needs no torch

    return dist.is_available() and dist.is_initialized()


# --------------------------------------------------------------------------- rank files

_RANK_SUFFIX = re.compile(r"\.rank(\d+)$")


def rank_path(path: str | os.PathLike, rank: int) -> Path:
    """``trace.sft`` -> ``trace.rank3.sft`` for rank 3. A path already naming a rank
    gets this rank's number instead (never ``trace.rank0.rank3.sft``, and two ranks
    given ``trace.rank0.sft`` still write two files)."""
    p = Path(path)
    stem = _RANK_SUFFIX.sub("", p.stem)
    return p.with_name(f"{stem}.rank{int(rank)}{p.suffix or '.sft'}")


def output_path(path: str | os.PathLike) -> Path:
    """Where this process saves a trace asked for at ``path``: its rank's file inside a
    process group of more than one rank, ``path`` itself otherwise."""
    if group_ready():
        import torch.distributed as dist

        if dist.get_world_size() > 1:
            return rank_path(path, dist.get_rank())
    return Path(path)


def rank_of_path(path: str | os.PathLike) -> int | None:
    """The rank a file name says (``trace.rank3.sft`` -> 3), or None."""
    m = _RANK_SUFFIX.search(Path(path).stem)
    return int(m.group(1)) if m else None


def rank_siblings(path: str | os.PathLike) -> list[Path]:
    """Every ``<stem>.rank<N><suffix>`` file beside ``path``, in rank order: given
    ``trace.sft`` or any one rank's file, the whole set that exists on disk."""
    p = Path(path)
    stem = _RANK_SUFFIX.sub("", p.stem)
    found = []
    for candidate in p.parent.glob(f"{glob.escape(stem)}.rank*{p.suffix or '.sft'}"):
        rank = rank_of_path(candidate)
        if rank is not None and _RANK_SUFFIX.sub("", candidate.stem) == stem:
            found.append((rank, candidate))
    return [c for _, c in sorted(found)]
