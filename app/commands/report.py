"""``scratchformer report``: a shape report of a trace file.

    scratchformer report demo.sft                          # Markdown to the terminal
    scratchformer report demo.sft --format csv -o shapes.csv
    scratchformer report demo.sft -o shapes.html           # format from the suffix
    scratchformer report demo.sft --format graphml -o graph.graphml
    scratchformer report demo.sft --proofs                 # why each axis has its name
    scratchformer report t.rank0.sft t.rank1.sft           # rank files: side by side
    scratchformer report t.sft                             # (t.rank*.sft beside it)

One row per module and one per step: path, type, op, source line, input and output shapes
with symbolic dims (``(B=1, H=4, T=24, T=24)``), dtype, parameters and stats.
``--proofs`` adds, per row, each axis's proof (``[B, T] carried by linear from its input's
axis``, ``[?=32] not proven``) and, per letter, the passes that moved it.

Several rank files (written under ``torchrun``) make one report (md or json): each rank's
output shapes side by side, every collective with its group, and the first step where
ranks that should agree do not (``tracing.rank_report``).
"""

from __future__ import annotations

import argparse
import sys

from app.commands.checks import output_file
from app.commands.options import add_command

FORMATS = ("md", "csv", "json", "html", "graphml")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "report", "write a shape report of a trace file", __doc__)
    p.add_argument(
        "trace",
        metavar="FILE",
        nargs="+",
        help="a trace file written by `scratchformer trace`, or several rank files",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        help="report format (default: from the -o suffix, else md)",
    )
    p.add_argument("-o", "--output", metavar="OUT", help="file to write (default: stdout)")
    p.add_argument(
        "--proofs",
        action="store_true",
        help="add why each axis has its name (per row) and which passes moved each letter",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import tracing
    from app.cli import UserError
    from tracing import collector
    from tracing.analysis import report

    rank_files = _rank_files(args.trace)
    inputs = [*args.trace, *(rank_files or ())]
    # checked before the work; never one of the files read
    out = output_file(args.output, inputs=inputs) if args.output else None
    fmt = args.format
    if fmt is None:
        if args.output:
            try:
                fmt = report.format_for(args.output)
            except ValueError as e:
                raise UserError(f"{e} with --format") from None
        else:
            fmt = "md"

    if rank_files is not None:
        from tracing.analysis import rank_report
        from tracing.analysis.ranks import load_ranks

        if fmt not in rank_report.FORMATS:
            raise UserError(f"a report over rank files is md or json, not {fmt}")
        if args.proofs:
            raise UserError("--proofs is for one trace file, not a report over rank files")
        ranks = load_ranks(rank_files)
        text = rank_report.render(ranks, fmt)
        return _write(text, out, fmt, f"{len(ranks)} ranks")
    # The trace and its rows are hundreds of thousands of small objects in no cycle, kept
    # until the command ends: the cyclic collector stays off meanwhile (load and compute
    # pause it anyway, but each pass it then owed the new objects came due afterwards,
    # a tenth of a 60,000-step report's time; see tracing.collector).
    with collector.paused():
        trace = tracing.load(args.trace[0])
        text = report.render_chunks(trace, fmt, proofs=args.proofs)  # pieces, as they come
        return _write(text, out, fmt, f"{len(trace.steps)} steps")


def _write(text, out, fmt: str, count: str) -> int:
    from app.cli import UserError
    from tracing.analysis import report

    if out is None:
        for chunk in (text,) if isinstance(text, str) else text:
            sys.stdout.write(chunk)
        return 0
    try:
        report.write_text(out, text)
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror or e}") from None
    print(f"wrote {out} ({fmt}, {count})", file=sys.stderr)
    return 0


def _rank_files(paths: list[str]) -> list | None:
    """The rank files to report together, or None for one ordinary trace: several files,
    or one name with ``<stem>.rank<N>`` files beside it and no file of its own."""
    from pathlib import Path

    from tracing.file.rank_paths import rank_siblings

    if len(paths) > 1:
        return [Path(p) for p in paths]
    only = Path(paths[0])
    if only.exists():
        return None
    return rank_siblings(only) or None
