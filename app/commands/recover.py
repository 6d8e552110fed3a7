"""``scratchformer recover``: a killed streamed capture, written out as a trace file.

    scratchformer recover t.sft.4242-1399.partial
    scratchformer recover t.sft.4242-1399.partial -o t.recovered.sft

A capture streamed with ``-o t.sft`` (or ``out=``) that was killed outright (``SIGKILL``,
the OOM killer) leaves ``t.sft.PID-TID.partial`` and its journal ``.journal`` beside it
(``tracing.file.journal``). ``tracing.load`` and ``scratchformer app`` open the partial
file as it is; this writes it out as an ordinary trace file (by default the name the
capture was writing) holding the steps and values up to its last checkpoint, and removes
the leftover. A capture whose process still runs is refused.
"""

from __future__ import annotations

import argparse
import sys

from app.commands.checks import output_file
from app.commands.options import add_command


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(
        subparsers, "recover", "write a killed streamed capture out as a trace", __doc__
    )
    p.add_argument("file", metavar="FILE", help="NAME.PID-TID.partial (or its .journal)")
    p.add_argument("-o", "--output", metavar="OUT", help="where to write (default: NAME)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tracing.file.journal import journal_of, leftover_parts, recover

    parts = leftover_parts(Path(args.file))
    inputs = (args.file,) if parts is None else (parts[0], parts[1], journal_of(parts[0]))
    out = output_file(args.output, inputs=inputs) if args.output else None
    written = recover(args.file, out)
    from tracing.file.loading import load

    trace = load(written)
    print(
        f"wrote {written} ({len(trace.steps)} steps, {len(trace.values)} values)", file=sys.stderr
    )
    trace.values.close()
    return 0
