"""The meta fields the tools read, checked when a trace is opened.

``meta`` is free-form (a user's ``meta=`` goes there as given), but some of its keys are
read by the tools: the prompt's ``tokens`` (the app's tensor view labels rows with them),
and a rank file's ``rank``, ``world_size`` and ``distributed`` tables (``tracing.ranks``,
the rank report, the rank window). A file carries whatever a stranger wrote, so each of
these is checked here, once, by :func:`check_meta` (``tracing.load`` calls it): a value of
the wrong type or out of range raises :class:`MetaProblem` naming the field, and
``tracing.load`` turns it into one ``TraceFileError``.

>>> check_meta({"world_size": 10**12}, steps=0, tensors=0)
Traceback (most recent call last):
...
tracing.meta_checks.MetaProblem: meta.world_size: 1000000000000 is not between 1 and 65,536
"""

from __future__ import annotations

from typing import Any

from tracing.formatting import step_number

MAX_WORLD_SIZE = 1 << 16
"""Most ranks a run may claim (a rank set lists the ranks it lacks, up to this many)."""

MAX_TOKEN = 1 << 63
PLACEMENTS = ("shard", "replicate", "partial")
MAX_MESH_DIMS = 8
SEQ = (list, tuple)


class MetaProblem(ValueError):
    """A meta field the tools read holds a value they cannot use; the message names it."""


def check_meta(meta: dict[str, Any], *, steps: int, tensors: int) -> None:
    """Raise :class:`MetaProblem` for the first meta field the tools read that is of the
    wrong type or out of range (``steps``, ``tensors``: how many the trace holds)."""
    if not isinstance(meta, dict):
        raise MetaProblem(f"meta: expected a table, got {type(meta).__name__}")
    _check_tokens(meta.get("tokens"))
    world = meta.get("world_size")
    if world is not None:
        _int(world, "meta.world_size", 1, MAX_WORLD_SIZE)
    rank = meta.get("rank")
    if rank is not None:
        _int(rank, "meta.rank", 0, (world or MAX_WORLD_SIZE) - 1)
    for key in ("backend",):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise MetaProblem(f"meta.{key}: expected text, got {type(meta[key]).__name__}")
    dist = meta.get("distributed")
    if dist is None:
        return
    if not isinstance(dist, dict):
        raise MetaProblem(f"meta.distributed: expected a table, got {type(dist).__name__}")
    collectives = dist.get("collectives")
    if collectives is not None:
        if not isinstance(collectives, SEQ):
            raise MetaProblem(
                f"meta.distributed.collectives: expected a list, got {type(collectives).__name__}"
            )
        for i, c in enumerate(collectives):
            _check_collective(c, f"meta.distributed.collectives[{i}]", steps)
    dtensors = dist.get("dtensors")
    if dtensors is not None:
        if not isinstance(dtensors, dict):
            raise MetaProblem(
                f"meta.distributed.dtensors: expected a table, got {type(dtensors).__name__}"
            )
        for tid, layout in dtensors.items():
            where = f"meta.distributed.dtensors[{str(tid)[:40]}]"
            _int(tid, f"{where} (a tensor id)", 0, tensors - 1)
            _check_layout(layout, where)


# --------------------------------------------------------------------------- older files


def upgrade_meta(meta: dict[str, Any]) -> None:
    """Read a field an older file stored with another meaning the way this version writes it.

    Files written before ``index`` was stored called a step's 0-based index ``step``; a
    field named ``step`` now holds the step number people read (1-based,
    ``tracing.formatting.step_number``) and ``index`` the index. So ``stopped_at`` (where a
    breakpoint stopped the capture) gets ``index`` and its ``step`` as a number, and each
    of ``distributed.collectives`` its ``index`` in place of ``step``. Runs after
    :func:`check_meta` (which names a bad field as the file spells it).
    """
    if not isinstance(meta, dict):
        return
    stopped = meta.get("stopped_at")
    if isinstance(stopped, dict) and "index" not in stopped and _whole(stopped.get("step")):
        index = stopped["step"]
        meta["stopped_at"] = {**stopped, "step": step_number(index), "index": index}
    dist = meta.get("distributed")
    collectives = dist.get("collectives") if isinstance(dist, dict) else None
    if isinstance(collectives, list):
        for i, c in enumerate(collectives):
            if isinstance(c, dict) and "index" not in c and "step" in c:
                collectives[i] = {("index" if k == "step" else k): v for k, v in c.items()}


def _whole(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# --------------------------------------------------------------------------- the parts


def _int(v: Any, where: str, low: int, high: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise MetaProblem(f"{where}: expected a whole number, got {type(v).__name__}")
    if not low <= v <= high:
        shown = str(v) if abs(v) < 10**30 else f"a {len(str(abs(v)))}-digit number"
        raise MetaProblem(f"{where}: {shown} is not between {low:,} and {high:,}")
    return v


def _int_list(v: Any, where: str, low: int = 0, high: int = MAX_TOKEN - 1) -> None:
    if not isinstance(v, SEQ):
        raise MetaProblem(f"{where}: expected a list of whole numbers, got {type(v).__name__}")
    for i, x in enumerate(v):
        _int(x, f"{where}[{i}]", low, high)


def _check_tokens(tokens: Any) -> None:
    if tokens is None:
        return
    if not isinstance(tokens, SEQ):
        raise MetaProblem(f"meta.tokens: expected a list of token ids, got {type(tokens).__name__}")
    if tokens and isinstance(tokens[0], SEQ):  # a batch of prompts
        for i, row in enumerate(tokens):
            _int_list(row, f"meta.tokens[{i}]")
    else:
        _int_list(tokens, "meta.tokens")


def _check_collective(c: Any, where: str, steps: int) -> None:
    if not isinstance(c, dict):
        raise MetaProblem(f"{where}: expected a table, got {type(c).__name__}")
    if not isinstance(c.get("op"), str):
        raise MetaProblem(f"{where}.op: expected the collective's name, got {_kind(c.get('op'))}")
    key = "index" if "index" in c else "step"  # "step": an older file's name for it
    if key in c:
        _int(c[key], f"{where}.{key}", 0, max(steps - 1, 0))
    if c.get("ranks") is not None:
        _int_list(c["ranks"], f"{where}.ranks", 0, MAX_WORLD_SIZE - 1)
    for key in ("group", "api", "phase", "reduce_op"):
        if c.get(key) is not None and not isinstance(c[key], str):
            raise MetaProblem(f"{where}.{key}: expected text, got {_kind(c[key])}")
    if c.get("placements") is not None:
        pair = c["placements"]
        if not isinstance(pair, SEQ) or len(pair) != 2:
            raise MetaProblem(f"{where}.placements: expected [before, after]")
        for side, placements in zip(("before", "after"), pair):
            _check_placements(placements, f"{where}.placements ({side})")


def _check_placements(placements: Any, where: str) -> None:
    if not isinstance(placements, SEQ) or len(placements) > MAX_MESH_DIMS:
        raise MetaProblem(f"{where}: expected a list of up to {MAX_MESH_DIMS} placements")
    for i, p in enumerate(placements):
        if not isinstance(p, SEQ) or not p or p[0] not in PLACEMENTS:
            raise MetaProblem(f"{where}[{i}]: expected one of {', '.join(PLACEMENTS)}")
        if p[0] == "shard":
            _int(p[1] if len(p) > 1 else None, f"{where}[{i}] (the shard dim)", 0, 64)
        if p[0] == "partial" and len(p) > 1 and not isinstance(p[1], str):
            raise MetaProblem(f"{where}[{i}]: the reduction is not text")


def _check_layout(layout: Any, where: str) -> None:
    if not isinstance(layout, dict):
        raise MetaProblem(f"{where}: expected a layout table, got {_kind(layout)}")
    mesh_shape = _mesh_shape(layout.get("mesh"), f"{where}.mesh")
    _check_placements(layout.get("placements"), f"{where}.placements")
    if len(layout["placements"]) != len(mesh_shape):
        raise MetaProblem(f"{where}.placements: one per mesh dim ({len(mesh_shape)}) expected")
    coordinate = layout.get("coordinate", [])
    _int_list(coordinate, f"{where}.coordinate", 0, MAX_WORLD_SIZE - 1)
    for key in ("local_shape", "global_shape"):
        if layout.get(key) is not None:
            _int_list(layout[key], f"{where}.{key}", 0, MAX_TOKEN - 1)
    dims = layout.get("mesh_dims", [])
    if not isinstance(dims, SEQ) or not all(isinstance(d, str) for d in dims):
        raise MetaProblem(f"{where}.mesh_dims: expected a list of names")


def _mesh_shape(mesh: Any, where: str) -> tuple[int, ...]:
    """The shape of a mesh of ranks (nested lists of whole numbers, every row as long)."""
    shape: list[int] = []
    level = [mesh]
    while level and isinstance(level[0], SEQ):
        if len(shape) == MAX_MESH_DIMS:
            raise MetaProblem(f"{where}: more than {MAX_MESH_DIMS} dims")
        width = len(level[0])
        if width == 0 or any(not isinstance(row, SEQ) or len(row) != width for row in level):
            raise MetaProblem(f"{where}: rows of different lengths")
        shape.append(width)
        level = [x for row in level for x in row]
        if len(level) > MAX_WORLD_SIZE:
            raise MetaProblem(f"{where}: more than {MAX_WORLD_SIZE:,} ranks")
    if not shape:
        raise MetaProblem(f"{where}: expected nested lists of ranks, got {_kind(mesh)}")
    for r in level:
        _int(r, f"{where} (a rank)", 0, MAX_WORLD_SIZE - 1)
    return tuple(shape)


def _kind(v: Any) -> str:
    return "nothing" if v is None else type(v).__name__
