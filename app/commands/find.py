"""``scratchformer find``: look for anything in a trace file, as the app's find box does.

    scratchformer find trace.sft softmax
    scratchformer find trace.sft "(B, H, T, T)"
    scratchformer find trace.sft attention.py:78
    scratchformer find trace.sft '#4120'
    scratchformer find trace.sft nan --limit 5

Matches module paths and types, op names, step numbers, source lines and their text,
tensor names, shapes and dims, and non-finite steps (``nan``, ``inf``), case-insensitive.
Prints one line per match, grouped by kind, with the steps it is at (1-based, as the
app's step bar counts); exits 1 when nothing matched.
"""

from __future__ import annotations

import argparse

from app.commands.options import add_command
from tracing.formatting import step_number


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "find", "find modules, ops, steps, sources, shapes", __doc__)
    p.add_argument("trace", metavar="TRACE", help="a trace file")
    p.add_argument("query", metavar="QUERY", help="text to look for (case-insensitive)")
    p.add_argument(
        "--limit", type=int, default=20, help="entries shown per kind (default 20; 0: all)"
    )
    p.set_defaults(func=run)


def steps_text(steps: tuple[int, ...], most: int = 6) -> str:
    """``#3, #9, #15 … (+40 more)``: 1-based step numbers, the first few."""
    if not steps:
        return "did not run"
    shown = ", ".join(f"#{step_number(s)}" for s in steps[:most])
    more = len(steps) - most
    return shown + (f" … (+{more} more)" if more > 0 else "")


def run(args: argparse.Namespace) -> int:
    from tracing.analysis.find import KIND_TITLES, FindIndex
    from tracing.file.loading import load
    from tracing.safe_text import inert

    trace = load(args.trace)
    result = FindIndex(trace).search(args.query)
    if not result:
        print(f"no match for {inert(args.query)!r} in {len(trace.steps)} steps")
        return 1
    lines = [f"{len(result.steps)} matching steps for {inert(args.query)!r}"]
    for kind in result.kinds:  # best first: the non-finite steps for "nan"
        entries = result.groups[kind]
        lines.append(f"\n{KIND_TITLES[kind]} ({len(entries)})")
        limit = len(entries) if args.limit <= 0 else args.limit
        for e in entries[:limit]:
            lines.append(f"  {inert(e.label)}  ·  {len(e.steps)} × {steps_text(e.steps)}")
        if len(entries) > limit:
            lines.append(f"  … {len(entries) - limit} more (--limit 0 for all)")
    print("\n".join(lines))
    return 0
