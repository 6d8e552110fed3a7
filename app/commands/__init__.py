"""One module per ``scratchformer`` subcommand.

Each module defines ``register(subparsers)`` which adds its parser and sets
``func=run`` where ``run(args) -> int`` does the work. ``app.cli`` imports them lazily so
that ``scratchformer --help`` does not pay for torch or Qt.
"""

COMMANDS = (
    "app", "trace", "report", "diff", "find", "patch", "train", "generate", "bench", "recover",
)  # fmt: skip
