"""What several commands share: the parser of a command, where its model comes from, and
how it talks on stderr.

- :func:`add_command` adds a subcommand whose ``--help`` shows the module's docstring as
  written (examples keep their line breaks).
- :func:`add_model_source` adds ``--checkpoint`` / ``--preset`` / ``--demo`` (/ ``--model``)
  and ``--seed``; :func:`load_model` turns them into a model and a description for the meta.
- :func:`stderr_say` prints progress notes on stderr unless ``--quiet``.

torch and the model are imported inside :func:`load_model`, so ``scratchformer --help``
stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from app.commands.checks import SEED, input_file


def add_command(
    subparsers: argparse._SubParsersAction, name: str, help: str, doc: str | None
) -> argparse.ArgumentParser:
    """The parser of subcommand ``name``: ``help`` in the command list, ``doc`` (the
    command module's docstring) as its description, laid out as written."""
    return subparsers.add_parser(
        name, help=help, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def add_model_source(p: argparse.ArgumentParser, *, own_model: bool = False) -> None:
    """``--checkpoint PATH`` | ``--preset NAME`` | ``--demo`` (the default) | with
    ``own_model`` ``--model FILE.py:NAME``; and ``--seed`` for a preset's random weights."""
    source = p.add_mutually_exclusive_group()
    source.add_argument("--checkpoint", metavar="PATH", help="a model checkpoint (.safetensors)")
    source.add_argument(
        "--preset", metavar="NAME", help="a preset (demo, nano, gpt2-small), random weights"
    )
    source.add_argument("--demo", action="store_true", help="the bundled demo model (the default)")
    if own_model:
        add_model_option(p, source)
    p.add_argument("--seed", type=SEED, default=0, help="weights seed for --preset (default 0)")


def add_model_option(p: argparse.ArgumentParser, group=None) -> None:
    """``--model`` (any source :mod:`app.core.model_sources` reads), ``--device`` and
    ``--tokenizer``: the same three options on every command that runs a model."""
    from app.core.model_sources import DEVICES, MODEL_HELP

    (group or p).add_argument(
        "--model",
        metavar="MODEL",
        help=MODEL_HELP + "; for FILE.py:NAME, NAME is an nn.Module, a class built with no "
        "arguments, or a function returning one (inputs: --prompt, --input-shape, or "
        "example_inputs in FILE)",
    )
    p.add_argument(
        "--device",
        choices=DEVICES,
        default="cpu",
        help="with --model: where the model is built and run (meta: shapes only, no memory "
        "for weights; default cpu)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="with --model: a tokenizer.json (or a folder with one) to encode --prompt "
        "(default: the model folder's own, else one token per byte)",
    )


def model_inputs(args: argparse.Namespace) -> list[Path]:
    """Every file the model options of ``args`` read (no output may be one of them, nor
    lie inside one that is a folder): the checkpoint, the bundled demo's, or all that
    :func:`app.core.model_sources.model_reads` says ``--model`` / ``--tokenizer`` read."""
    from app.core.model_sources import model_reads

    files = model_reads(getattr(args, "model", None), getattr(args, "tokenizer", None))
    if getattr(args, "checkpoint", None):
        files.append(Path(args.checkpoint).expanduser())
    elif not files and not getattr(args, "preset", None):  # the bundled demo model
        from scratchformer import demo_checkpoint_path

        files.append(Path(str(demo_checkpoint_path())))
    return files


def load_any_model(args: argparse.Namespace, inputs=None):
    """``--model`` with ``--device`` / ``--tokenizer`` through the one loader, as a
    :class:`app.core.user_model.LoadedModel`; a failure is one ``error:`` line."""
    from app.cli import UserError
    from app.core.model_sources import load
    from app.core.user_model import UserCodeError

    try:
        return load(
            args.model,
            inputs,
            device=getattr(args, "device", "cpu"),
            tokenizer=getattr(args, "tokenizer", None),
            seed=getattr(args, "seed", 0),
        )
    except UserCodeError as e:
        raise UserError(str(e)) from e


def load_model(args: argparse.Namespace, say: Callable[[str], None]) -> tuple[object, dict]:
    """The model :func:`add_model_source`'s options name, and where it came from (for a
    trace's meta): ``{"source": "checkpoint" | "preset" | "demo", ...}``."""
    import torch

    from app.cli import UserError
    from scratchformer import DecoderOnlyTransformer, ModelConfig, demo_model, load_checkpoint

    if args.checkpoint:
        path = input_file(args.checkpoint, "checkpoint")
        return load_checkpoint(path), {"source": "checkpoint", "checkpoint": str(path)}
    if args.preset:
        if args.preset not in ModelConfig.PRESETS:
            raise UserError(
                f"unknown preset {args.preset!r}; choose one of {', '.join(ModelConfig.PRESETS)}"
            )
        torch.manual_seed(args.seed)
        model = DecoderOnlyTransformer(ModelConfig.preset(args.preset)).eval()
        say(
            f"note: preset {args.preset!r} is built with random weights (seed {args.seed}): "
            "shapes are real, values are not meaningful"
        )
        return model, {"source": "preset", "preset": args.preset, "seed": args.seed}
    return demo_model(), {"source": "demo"}


def stderr_say(quiet: bool) -> Callable[[str], None]:
    """A ``say(message)`` that prints on stderr, or nothing when ``quiet``."""

    def say(message: str) -> None:
        if not quiet:
            print(message, file=sys.stderr)

    return say
