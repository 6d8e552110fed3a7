"""``scratchformer diff``: compare two trace files step by step.

    scratchformer diff before.trace after.trace
    scratchformer diff a.trace b.trace --format json -o diff.json
    scratchformer diff a.trace b.trace --atol 1e-5 --all

The traces are aligned by (kind, module, op, call, occurrence), so the same model on two
prompts, two versions of a model, or a checkpoint before and after training line up. For
every aligned step it reports shape changes and, where both traces kept values
(``--capture values``), the max absolute difference, relative L2 and cosine similarity;
steps present on one side only are listed as such. Markdown shows the steps that differ
(``--all`` for every step); JSON always holds every step.
"""

from __future__ import annotations

import argparse
import sys

from app.commands.checks import float_between, output_file
from app.commands.options import add_command


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "diff", "compare two trace files step by step", __doc__)
    p.add_argument("a", metavar="A", help="first trace file")
    p.add_argument("b", metavar="B", help="second trace file")
    p.add_argument("--format", choices=("md", "json"), default="md", help="output format")
    p.add_argument("-o", "--output", metavar="OUT", help="write here instead of stdout")
    p.add_argument(
        "--atol",
        type=float_between(0, 1e300),
        default=0.0,
        help="differences up to this are not divergence (default 0: any difference)",
    )
    p.add_argument("--all", action="store_true", help="markdown: list every step, not only diffs")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.cli import UserError
    from tracing.analysis.report import write_text
    from tracing.analysis.trace_diff import diff
    from tracing.file.loading import load

    # checked before the work; never one of the files read
    out = output_file(args.output, inputs=(args.a, args.b)) if args.output else None
    traces = [load(name) for name in (args.a, args.b)]
    result = diff(*traces)
    text = result.render(args.format, atol=args.atol, all_steps=args.all)
    if out is not None:
        try:
            write_text(out, text)
        except OSError as e:
            raise UserError(f"cannot write {out}: {e.strerror or e}") from None
        first = result.first_divergence(args.atol)
        where = "no divergence" if first is None else f"first divergence: {first.label}"
        print(f"wrote {out} ({len(result)} aligned steps, {where})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
