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
import os
import sys
from pathlib import Path

from app.commands import ranks

VALUE_DTYPES = ("float32", "float16", "bfloat16")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "trace",
        help="trace one forward pass into a trace file",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument("--checkpoint", metavar="PATH", help="a model checkpoint (.safetensors)")
    source.add_argument("--preset", metavar="NAME", help="a preset (demo, nano, gpt2-small)")
    source.add_argument("--demo", action="store_true", help="the bundled demo model (the default)")
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
        type=float,
        help="with --capture values: keep no copy of a tensor larger than this (MiB)",
    )
    p.add_argument(
        "--no-stream",
        action="store_true",
        help="keep values in memory and save at the end (default: write each to the file "
        "as it is produced, so memory stays flat)",
    )
    p.add_argument("--seed", type=int, default=0, help="weights seed for --preset (default 0)")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="trace file to write")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    ranks.add_arguments(p)
    p.set_defaults(func=run)


def _check_output(path: Path) -> None:
    """Fail before any work when the trace could not be written."""
    from app.cli import UserError

    if path.is_dir():
        raise UserError(f"cannot write {path}: it is a folder")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UserError(f"cannot write {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UserError(f"cannot write {path}: permission denied")


def _load_model(args: argparse.Namespace, say) -> tuple[object, dict]:
    """The model to trace and a description of where it came from (for the meta)."""
    import torch

    from app.cli import UserError
    from scratchformer import DecoderOnlyTransformer, ModelConfig, demo_model, load_checkpoint

    if args.checkpoint:
        path = Path(args.checkpoint)
        if not path.is_file():
            raise UserError(f"checkpoint not found: {path}")
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


def run(args: argparse.Namespace) -> int:
    output, args.quiet = ranks.join(args, Path(args.output))  # under torchrun: rank files
    try:
        return _run(args, output)
    finally:
        ranks.leave()


def _run(args: argparse.Namespace, output: Path) -> int:
    import torch

    import tracing
    from app.cli import UserError
    from app.progress import ProgressBar
    from scratchformer import DEMO_PROMPT, ByteTokenizer

    quiet = args.quiet

    def say(message: str) -> None:
        if not quiet:
            print(message, file=sys.stderr)

    # --- arguments, checked before any slow work
    _check_output(output)
    prompt = DEMO_PROMPT if args.prompt is None else args.prompt
    if not prompt:
        raise UserError("the prompt is empty; give some text with --prompt")
    if args.capture != "values" and (args.value_dtype or args.value_cap_mb is not None):
        raise UserError("--value-dtype and --value-cap-mb need --capture values")
    if args.value_cap_mb is not None and args.value_cap_mb <= 0:
        raise UserError("--value-cap-mb must be positive")

    # --- model and tokens (any problem here is reported before tracing starts)
    model, origin = _load_model(args, say)
    block_size = getattr(getattr(model, "config", None), "block_size", None)
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode(prompt)
    if block_size is not None and len(ids) > block_size:
        raise UserError(
            f"the prompt is {len(ids)} tokens (bytes) long but the model's block_size is "
            f"{block_size}; shorten it"
        )
    options = {}
    if args.capture == "values":
        if args.value_dtype:
            options["value_dtype"] = getattr(torch, args.value_dtype)
        if args.value_cap_mb is not None:
            options["value_cap"] = int(args.value_cap_mb * 2**20)
    meta = {
        "tokens": ids,
        "text": prompt,
        "token_labels": [tokenizer.token_str(i) for i in ids],
        **origin,
    }
    x = torch.tensor([ids], dtype=torch.long)  # (B, T)

    # --- trace, then save (also a partial trace: that is when the debugger is needed)
    stages = ProgressBar(2, f"trace {len(ids)} tokens", stream=io.StringIO() if quiet else None)
    failure = None
    if not args.no_stream:
        options["out"] = output  # values go to the file as they come; the header at the end
    try:
        trace = tracing.trace(ranks.wrap(model, args), x, capture=args.capture, meta=meta,
                              **options)  # fmt: skip
    except tracing.TraceError as e:
        trace, failure = e.trace, e
    stages.update(1, stage="saving")
    if getattr(trace.values, "path", None) != output:  # not streamed there: save it now
        tracing.save(trace, output)
    stages.update(1, stage="done")
    stages.close()

    size = output.stat().st_size
    kept = len({r.value_key for r in trace.tensors if r.value_key is not None})
    print(
        f"wrote {output}: {len(trace.steps)} steps, {len(trace.tensors)} tensors, "
        f"{kept} values kept, {_human_bytes(size)}"
    )
    if failure is not None:
        print(
            f"error: the forward pass raised: {trace.error or failure}; "
            f"the partial trace was saved to {output}",
            file=sys.stderr,
        )
        return 1
    return 0


def _human_bytes(n: float) -> str:
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("kB", "MB", "GB"):
        n /= 1000
        if n < 1000 or unit == "GB":
            break
    return f"{n:.1f} {unit}"
