"""``scratchformer report``: a shape report of a trace file.

    scratchformer report demo.sft                          # Markdown to the terminal
    scratchformer report demo.sft --format csv -o shapes.csv
    scratchformer report demo.sft -o shapes.html           # format from the suffix
    scratchformer report demo.sft --format graphml -o graph.graphml

One row per module and one per step: path, type, op, source line, input and output shapes
with symbolic dims (``(B=1, H=4, T=24, T=24)``), dtype, parameters and stats.
"""

from __future__ import annotations

import argparse
import sys

from app.commands.checks import output_file

FORMATS = ("md", "csv", "json", "html", "graphml")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="write a shape report of a trace file",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("trace", metavar="FILE", help="a trace file written by `scratchformer trace`")
    p.add_argument(
        "--format",
        choices=FORMATS,
        help="report format (default: from the -o suffix, else md)",
    )
    p.add_argument("-o", "--output", metavar="OUT", help="file to write (default: stdout)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import tracing
    from app.cli import UserError
    from tracing import report

    out = output_file(args.output) if args.output else None  # checked before the work
    fmt = args.format
    if fmt is None:
        if args.output:
            try:
                fmt = report.format_for(args.output)
            except ValueError as e:
                raise UserError(f"{e} with --format") from None
        else:
            fmt = "md"

    trace = tracing.load(args.trace)
    text = report.render(trace, fmt)
    if out is None:
        sys.stdout.write(text)
        return 0
    try:
        report.write_text(out, text)
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror or e}") from None
    print(f"wrote {out} ({fmt}, {len(trace.steps)} steps)", file=sys.stderr)
    return 0
