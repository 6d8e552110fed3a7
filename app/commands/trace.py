"""``scratchformer trace``: record one forward pass into a trace file.

    scratchformer trace -o demo.sft                               # bundled demo model
    scratchformer trace --preset nano --prompt "hello" -o nano.sft
    scratchformer trace --checkpoint my.safetensors --capture values --value-dtype float16 -o my.sft
    torchrun --nproc_per_node 2 -m app.cli trace --ddp -o t.sft   # t.rank0.sft, t.rank1.sft

The prompt is encoded with the byte tokenizer (one token per UTF-8 byte); the trace's meta
keeps the tokens and the text. A ``--preset`` model has random weights (seeded by
``--seed``): its shapes are real, its values are not meaningful. If the forward pass
raises, the partial trace (up to the failing step) is still written, and the command
exits with status 1.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

from app.commands import ranks
from app.commands.checks import float_between, output_file
from app.commands.options import (
    add_command,
    add_model_source,
    load_model,
    model_inputs,
    stderr_say,
)

VALUE_DTYPES = ("float32", "float16", "bfloat16")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "trace", "trace one forward pass into a trace file", __doc__)
    add_model_source(p, own_model=True)
    add_input_arguments(p)
    p.add_argument("--prompt", help="text to feed the model (default: the demo prompt)")
    p.add_argument(
        "--capture",
        choices=("shapes", "stats", "values"),
        default="stats",
        help="what to keep per tensor (default: stats; attention maps are always kept)",
    )
    p.add_argument(
        "--value-dtype",
        choices=VALUE_DTYPES,
        help="with --capture values: store floating values in this dtype",
    )
    p.add_argument(
        "--value-cap-mb",
        type=float_between(0, 2**40, low_open=True),
        help="with --capture values: keep no copy of a tensor larger than this (MiB)",
    )
    p.add_argument(
        "--no-stream",
        action="store_true",
        help="keep values in memory and save at the end (default: write each to the file "
        "as it is produced, so memory stays flat)",
    )
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="trace file to write")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    ranks.add_arguments(p)
    p.set_defaults(func=run)


def add_input_arguments(p: argparse.ArgumentParser) -> None:
    """``--input-shape`` and ``--input-dtype``: the inputs of a ``--model`` (after --prompt)."""
    p.add_argument(
        "--input-shape",
        metavar="2,10",
        help="with --model: trace on random inputs of this shape (after --prompt)",
    )
    p.add_argument(
        "--input-dtype",
        choices=("long", "float"),
        default="long",
        help="with --input-shape: long = random token ids below the first embedding's "
        "size, float = randn (default long)",
    )


def load_user_model(args: argparse.Namespace):
    """``--model`` (a file, a folder, a config) with its inputs, or one ``error:`` line."""
    from app.cli import UserError
    from app.commands.options import load_any_model
    from app.core.user_model import InputSpec, UserCodeError

    try:
        shape = InputSpec.parse_shape(args.input_shape) if args.input_shape else None
    except UserCodeError as e:
        raise UserError(str(e)) from e
    return load_any_model(args, InputSpec(prompt=args.prompt, shape=shape, dtype=args.input_dtype))


def run(args: argparse.Namespace) -> int:
    output, args.quiet = ranks.join(args, Path(args.output))  # under torchrun: rank files
    try:
        return _run(args, output)
    finally:
        ranks.leave()


def _run(args: argparse.Namespace, output: Path) -> int:
    import torch

    from app.cli import UserError
    from scratchformer import DEMO_PROMPT, ByteTokenizer

    say = stderr_say(args.quiet)

    # --- arguments, checked before any slow work
    output_file(output, inputs=model_inputs(args))
    prompt = DEMO_PROMPT if args.prompt is None else args.prompt
    if not prompt:
        raise UserError("the prompt is empty; give some text with --prompt")
    if args.capture != "values" and (args.value_dtype or args.value_cap_mb is not None):
        raise UserError("--value-dtype and --value-cap-mb need --capture values")
    options = {}
    if args.capture == "values":
        if args.value_dtype:
            options["value_dtype"] = getattr(torch, args.value_dtype)
        if args.value_cap_mb is not None:
            options["value_cap"] = int(args.value_cap_mb * 2**20)

    if args.model:
        loaded = load_user_model(args)
        if loaded.rebuild is not None:
            options["rebuild"] = loaded.rebuild
        return _trace_and_save(
            loaded.model, loaded.args, loaded.kwargs, loaded.meta, args, options, output
        )

    # --- model and tokens (any problem here is reported before tracing starts)
    model, origin = load_model(args, say)
    block_size = getattr(getattr(model, "config", None), "block_size", None)
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode(prompt)
    if block_size is not None and len(ids) > block_size:
        raise UserError(
            f"the prompt is {len(ids)} tokens (bytes) long but the model's block_size is "
            f"{block_size}; shorten it"
        )
    meta = {
        "tokens": ids,
        "text": prompt,
        "token_labels": [tokenizer.token_str(i) for i in ids],
        **origin,
    }
    x = torch.tensor([ids], dtype=torch.long)  # (B, T)
    return _trace_and_save(model, (x,), {}, meta, args, options, output)


def _trace_and_save(model, inputs, kwargs, meta, args, options, output: Path) -> int:
    """Trace, then save (a partial trace too: that is when the debugger is needed)."""
    import tracing
    from app.core.progress import ProgressBar

    quiet = args.quiet
    tokens = meta.get("tokens")
    what = f"{len(tokens)} tokens" if tokens else meta.get("inputs", "the model")
    stages = ProgressBar(2, f"trace {what}", stream=io.StringIO() if quiet else None)
    failure = None
    if not args.no_stream:
        options["out"] = output  # values go to the file as they come; the header at the end
    try:
        trace = tracing.trace(
            ranks.wrap(model, args), *inputs, capture=args.capture, meta=meta, **options, **kwargs
        )
    except tracing.TraceError as e:
        trace, failure = e.trace, e
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM: keep what was recorded, then stop
        partial = getattr(e, "trace", None)
        if partial is not None:
            _keep(partial, output, getattr(e, "kept", False), "interrupted")
        raise
    except BaseException as e:  # sys.exit() or another BaseException inside the forward
        if getattr(e, "trace", None) is None:
            raise
        trace, failure = e.trace, e
        if isinstance(e, tracing.TraceFileError) and hasattr(e, "kept"):
            raise  # streamed, and it could not be finished: the error says where it is
    stages.update(1, stage="saving")
    if getattr(trace.values, "path", None) != output:  # not streamed there: save it now
        _save(trace, output, "the trace was saved")
    stages.update(1, stage="done")
    stages.close()

    size = output.stat().st_size
    kept = len({r.value_key for r in trace.tensors if r.value_key is not None})
    print(
        f"wrote {output}: {len(trace.steps)} steps, {len(trace.tensors)} tensors, "
        f"{kept} values kept, {_human_bytes(size)}"
    )
    if failure is not None:
        from app.cli import _one_line

        cause = trace.error or _one_line(failure)
        print(
            f"error: the forward pass raised: {_one_line(Exception(cause))}; "
            f"the partial trace was saved to {output}",
            file=sys.stderr,
        )
        return 1
    return 0


def _save(trace, output: Path, what: str) -> None:
    """``tracing.save``, finished before Ctrl-C or SIGTERM act (they then say where)."""
    import tracing
    from app.cli import signals_held

    with signals_held(f"interrupted while saving: {what} to {output}"):
        tracing.save(trace, output)


def _keep(partial, output: Path, kept, why: str) -> None:
    """An interrupted capture's trace: saved to ``output``, unless it was streamed (then
    the file is finished there already, or kept as a partial file beside it), and said."""
    where = getattr(partial.values, "path", None)
    if kept is None:  # streamed, and nothing of it could be written
        print(f"{why}: nothing could be kept", file=sys.stderr)
        return
    if where is None or (kept is False and Path(where) != output):  # in memory: save it
        _save(partial, output, "the partial trace was saved")
        where = output
    print(f"{why}: the partial trace was saved to {where}", file=sys.stderr)


def _human_bytes(n: float) -> str:
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("kB", "MB", "GB"):
        n /= 1000
        if n < 1000 or unit == "GB":
            break
    return f"{n:.1f} {unit}"
