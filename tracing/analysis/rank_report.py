"""The report of a set of rank files: each rank's shapes side by side, and the collectives.

``compute(ranks)`` gathers plain rows; ``render(ranks, fmt)`` lays them out as Markdown
(for a terminal) or JSON (for scripts), as ``tracing.report`` does for one trace.

- a summary per rank: file, host, steps, tensors, collectives;
- the collectives: step, module, op, group and its ranks, what went in and came out on
  each rank (``Partial(sum) -> Replicate`` for a DTensor redistribution);
- one row per step with each rank's output shapes (a DTensor's local shard and, after
  ``of``, its global shape), marked where ranks disagree in shape;
- the first divergence across ranks, when there is one (``tracing.ranks``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from tracing import markdown
from tracing.analysis.ranks import RankSet, collectives_of, layout_of
from tracing.formatting import format_shape, step_number

FORMATS = ("md", "json")


@dataclass
class RankRow:
    """One step of the first rank, with each rank's output shapes (None: step missing)."""

    step: int
    module: str
    op: str
    shapes: dict[int, str | None]
    differs: bool  # the ranks' output shapes differ


@dataclass
class RankReport:
    world_size: int
    backend: str
    ranks: list[dict[str, Any]]  # rank, file, host, steps, tensors, collectives
    missing: list[int]
    collectives: list[dict[str, Any]] = field(default_factory=list)
    rows: list[RankRow] = field(default_factory=list)
    divergence: dict[str, Any] | None = None


def placements_text(placements: list) -> str:
    def one(p: list) -> str:
        if p[0] == "shard":
            return f"Shard({p[1]})"
        if p[0] == "partial":
            return f"Partial({p[1] if len(p) > 1 else 'sum'})"
        return p[0].capitalize()

    return ", ".join(one(p) for p in placements)


def collective_detail(c: dict[str, Any]) -> str:
    """What a collectives table says of one collective beyond its op: the reduce op or the
    placements it moved between, src/dst, and for one of a training step's backward its
    phase and DDP bucket (``bucket 2: 4 gradients``)."""
    parts = []
    if c["op"] == "redistribute":
        src, dst = c["placements"]
        parts.append(f"{placements_text(src)} → {placements_text(dst)}")
    elif c.get("reduce_op"):
        parts.append(str(c["reduce_op"]))
    parts += [f"{key}={c[key]}" for key in ("src", "dst") if key in c]
    if c.get("phase") == "backward":
        parts.append("backward")
        if "bucket" in c:
            parts.append(f"bucket {c['bucket']}: {len(c['params'])} gradients")
        elif c.get("what"):
            parts.append(c["what"])
    return ", ".join(parts)


def _outputs_text(ranks: RankSet, rank: int, step_index: int | None) -> str | None:
    if step_index is None:
        return None
    trace = ranks[rank]
    parts = []
    for tid in trace.steps[step_index].outputs:
        rec = trace.tensors[tid]
        text = format_shape(rec.shape, rec.dims)
        layout = layout_of(trace, tid)
        if layout is not None:
            glob = "(" + ", ".join(str(s) for s in layout["global_shape"]) + ")"
            text += f" of {glob} {placements_text(layout['placements'])}"
        parts.append(text)
    return ", ".join(parts)


def compute(ranks: RankSet) -> RankReport:
    first = ranks.first
    rank_rows = []
    for rank, trace in ranks.traces.items():
        dist = trace.meta.get("distributed") or {}
        path = ranks.paths.get(rank)
        rank_rows.append(
            {
                "rank": rank,
                "file": path.name if path is not None else "",
                "host": dist.get("host", ""),
                "steps": len(trace.steps),
                "tensors": len(trace.tensors),
                "collectives": len(dist.get("collectives") or []),
            }
        )
    report = RankReport(
        world_size=ranks.world_size,
        backend=str(first.meta.get("backend", "")),
        ranks=rank_rows,
        missing=ranks.missing,
    )
    for entry in collectives_of(first):
        index = entry.get("index")
        if index is None:
            continue
        step = first.steps[index]
        row = {k: v for k, v in entry.items() if k != "index"}
        row.update(step=step_number(index), module=step.module, inputs={}, outputs={})
        for rank in ranks.ranks:
            other = _aligned(ranks, rank, index)
            trace = ranks[rank]
            if other is None:
                continue
            s = trace.steps[other]
            row["inputs"][rank] = [list(trace.tensors[t].shape) for t in s.inputs]
            row["outputs"][rank] = [list(trace.tensors[t].shape) for t in s.outputs]
        report.collectives.append(row)
    for step in first.steps:
        shapes = {r: _outputs_text(ranks, r, _aligned(ranks, r, step.index)) for r in ranks}
        differs = len(set(shapes.values())) > 1
        report.rows.append(RankRow(step_number(step.index), step.module, step.op, shapes, differs))
    found = ranks.first_divergence()
    if found is not None:
        report.divergence = {
            "rank": found.rank,
            "step": None if found.step is None else step_number(found.step),
            "label": found.label,
            "reason": found.reason,
            "max_abs": found.entry.max_abs,
        }
    return report


def _aligned(ranks: RankSet, rank: int, index: int) -> int | None:
    if rank == ranks.ranks[0]:
        return index
    entry = ranks.diff(rank).for_step_a(index)
    return None if entry is None else entry.b_index


def render(ranks: RankSet | RankReport, fmt: str = "md") -> str:
    """The report as Markdown (``md``) or JSON (``json``)."""
    report = ranks if isinstance(ranks, RankReport) else compute(ranks)
    from tracing.safe_text import inert_document

    if fmt == "json":  # ASCII: every control character escaped
        return json.dumps(asdict(report), indent=1, default=str) + "\n"
    if fmt != "md":
        raise ValueError(f"unknown rank report format {fmt!r}; choose one of {FORMATS}")
    return inert_document(_render_md(report))  # names from the files: controls escaped


def _render_md(report: RankReport) -> str:
    lines = [f"# Ranks: {len(report.ranks)} of {report.world_size} ({report.backend})", ""]
    if report.missing:
        lines += [f"**missing ranks:** {', '.join(map(str, report.missing))}", ""]
    lines += markdown.table(
        ["rank", "file", "host", "steps", "tensors", "collectives"],
        [[str(r[k]) for k in ("rank", "file", "host", "steps", "tensors", "collectives")]
         for r in report.ranks],
    )  # fmt: skip
    lines.append("")
    if report.divergence is not None:
        d = report.divergence
        label = markdown.escape(d["label"])
        lines += [
            f"**first divergence:** step {d['step']} `{label}` on rank {d['rank']}"
            f" ({d['reason']}, max |diff| {d['max_abs'] if d['max_abs'] is not None else '?'})",
            "",
        ]
    else:
        lines += ["Ranks agree wherever they should (replicas, Replicate, collective results).", ""]
    lines += ["## Collectives", ""]
    if report.collectives:
        rows = []
        for c in report.collectives:
            detail = collective_detail(c)
            shapes = "; ".join(
                f"r{r}: {_shapes(c['inputs'].get(r))} → {_shapes(c['outputs'].get(r))}"
                for r in c["outputs"]
            )
            rows.append(
                [str(c["step"]), markdown.code(c["module"] or "<root>"), c["op"], c["api"],
                 f"{c['group']} {c['ranks']}", markdown.escape(detail.strip()),
                 markdown.escape(shapes)]
            )  # fmt: skip
        lines += markdown.table(["step", "module", "op", "api", "group", "detail", "shapes"], rows)
    else:
        lines.append("No collective ran in the trace.")
    lines += ["", "## Output shapes per rank", ""]
    ranks = [r["rank"] for r in report.ranks]
    rows = []
    for row in report.rows:
        mark = " ≠" if row.differs else ""
        cells = [markdown.escape(row.shapes.get(r) or "—") for r in ranks]
        rows.append([f"{row.step}{mark}", markdown.code(row.module or "<root>"), row.op, *cells])
    lines += markdown.table(["step", "module", "op", *(f"rank {r}" for r in ranks)], rows)
    return "\n".join(lines) + "\n"


def _shapes(shapes: list | None) -> str:
    if not shapes:
        return "—"
    return ", ".join(format_shape(shape) for shape in shapes)


__all__ = [
    "FORMATS",
    "RankReport",
    "RankRow",
    "collective_detail",
    "compute",
    "placements_text",
    "render",
]
