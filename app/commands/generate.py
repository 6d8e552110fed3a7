"""``scratchformer generate``: continue a prompt with a trained model.

    scratchformer generate --demo --prompt "hello|" --temperature 0
    scratchformer generate --checkpoint nano.safetensors --prompt "The " --max-new-tokens 200
    scratchformer generate --demo --prompt "hello|" --trace run.gen --capture values
    scratchformer generate --model ./my-hf-model --prompt "The cat" --temperature 0

Prints the prompt followed by the generated text, made inert: a control character that
a model or a stranger's tokenizer produced is shown escaped (``\\x1b``), never sent to
the terminal; newlines and tabs are kept. ``--temperature 0`` is greedy
(deterministic); otherwise ``--seed`` makes sampling reproducible. ``--trace FOLDER``
traces every pass and writes the generation folder (``tracing.generation.load_generation``
reads it): each pass's values go to its file as they are produced, so memory stays flat
(``--no-stream``: keep them in memory and save at the end). A pass that raises, or Ctrl-C,
still leaves a valid folder with the passes so far and the partial one.
"""

from __future__ import annotations

import argparse

from app.commands.checks import SEED, float_between, input_file, int_between, output_folder
from app.commands.options import add_command, add_model_option, model_inputs
from tracing.safe_text import inert_document

GREEDY_BELOW = 1e-4
"""A temperature below this samples as greedy (argmax): dividing logits by it overflows."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(
        subparsers, "generate", "generate text from a checkpoint or the bundled demo model", __doc__
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--checkpoint", metavar="PATH", help="a .safetensors checkpoint")
    which.add_argument("--demo", action="store_true", help="the bundled demo model")
    add_model_option(p, which)
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument("--max-new-tokens", type=int_between(0, 100_000), default=32)
    p.add_argument(
        "--temperature",
        type=float_between(0, 1e6),
        default=1.0,
        help=f"0 = greedy (argmax); below {GREEDY_BELOW:g} acts as 0",
    )
    p.add_argument(
        "--top-k", type=int_between(1, 2**31), help="sample among the k most likely tokens only"
    )
    p.add_argument("--seed", type=SEED, default=0, help="random seed for sampling")
    p.add_argument(
        "--trace",
        metavar="FOLDER",
        help="trace every pass and write the generation to this folder (streamed)",
    )
    p.add_argument(
        "--capture",
        choices=("shapes", "stats", "values"),
        default="stats",
        help="with --trace: what to keep per tensor (default: stats)",
    )
    p.add_argument(
        "--no-stream",
        action="store_true",
        help="with --trace: keep values in memory and save at the end",
    )
    p.add_argument(
        "--stop",
        help="stop after this character (default: the task's end marker '.' for a model "
        "trained on a task, none for text)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from app.cli import UserError
    from scratchformer import ByteTokenizer, demo_checkpoint_path, load_checkpoint, read_metadata
    from scratchformer.tasks import get_task

    temperature = 0.0 if args.temperature < GREEDY_BELOW else args.temperature
    if not args.prompt:
        raise UserError("--prompt is empty; the model needs at least one token to continue")
    if args.trace:  # checked before any work: never an input, nor inside a model folder
        output_folder(args.trace, inputs=model_inputs(args))

    if args.model:
        return _any_model(args, temperature)
    if args.demo:
        from importlib import resources

        with resources.as_file(demo_checkpoint_path()) as path:
            meta = read_metadata(path)
            model = load_checkpoint(path)
    else:
        path = input_file(args.checkpoint, "checkpoint")
        meta = read_metadata(path)
        model = load_checkpoint(path)
    if meta["tokenizer"] != "byte":
        raise UserError(
            f"this checkpoint uses the {meta['tokenizer']!r} tokenizer; "
            "generate supports byte-level checkpoints only"
        )

    tok = ByteTokenizer()
    stop = args.stop
    if stop is None and meta["extra"].get("task"):
        stop = get_task(meta["extra"]["task"]).end
    stop_token = None
    if stop:
        stop_ids = tok.encode(stop)
        if len(stop_ids) != 1:
            raise UserError(f"--stop must be a single byte character, got {stop!r}")
        stop_token = stop_ids[0]

    idx = torch.tensor([tok.encode(args.prompt)], dtype=torch.long)
    generator = torch.Generator().manual_seed(args.seed)
    if args.trace:
        return _traced(model, idx, args, temperature, generator, stop_token, tok)
    out = model.generate(
        idx,
        args.max_new_tokens,
        temperature=temperature,
        top_k=args.top_k,
        generator=generator,
        stop_token=stop_token,
    )
    new = out[0, idx.size(1) :].tolist()
    print(inert_document(args.prompt + tok.decode(new)))
    return 0


def _traced(model, idx, args, temperature, generator, stop_token, tok, meta=None) -> int:
    """``generate --trace``: one traced pass per token, written to the folder as it goes."""
    import sys
    from pathlib import Path

    import tracing
    from app.cli import _one_line
    from app.core.progress import ProgressBar
    from tracing.runs.generation import trace_generate

    folder = Path(args.trace)  # checked by run()
    bar = ProgressBar(args.max_new_tokens, "trace generation")
    handle = model.register_forward_hook(lambda *_: bar.update(1))
    try:
        generation = trace_generate(
            model, idx, args.max_new_tokens, temperature=temperature, top_k=args.top_k,
            generator=generator, capture=args.capture, stop_token=stop_token,
            decode=tok.decode, out=folder, stream=not args.no_stream, meta=meta or {},
        )  # fmt: skip
    except (tracing.TraceError, KeyboardInterrupt) as e:
        bar.close()
        partial = getattr(e, "generation", None)
        done = len(partial.passes) if partial is not None else 0
        print(f"error: {_one_line(e)}; {done} pass(es) and the partial one were saved to "
              f"{folder}", file=sys.stderr)  # fmt: skip
        if isinstance(e, KeyboardInterrupt):
            raise
        return 1
    finally:
        handle.remove()
    bar.close()
    print(inert_document(args.prompt + tok.decode(generation.tokens)))
    print(f"wrote {folder}: {len(generation.passes)} traced passes, "
          f"{generation.step_count()} steps", file=sys.stderr)  # fmt: skip
    return 0


def _any_model(args: argparse.Namespace, temperature: float) -> int:
    """``generate --model``: a file model or a Hugging Face one, its tokenizer's text."""
    import torch

    from app.cli import UserError
    from app.commands.options import load_any_model
    from app.core.user_model import InputSpec
    from tracing.runs.generation import generate_ids

    if args.model and getattr(args, "device", "cpu") == "meta":
        raise UserError("generate --device meta: a meta model computes no values to sample from")
    loaded = load_any_model(args, InputSpec(prompt=args.prompt))
    tok = loaded.tokenizer or _Bytes()
    stop_token = None
    if args.stop:
        stop_ids = tok.encode(args.stop)
        if len(stop_ids) != 1:
            raise UserError(f"--stop must be a single token, got {args.stop!r}")
        stop_token = stop_ids[0]
    idx = loaded.args[0]
    generator = torch.Generator().manual_seed(args.seed)
    if args.trace:
        meta = {k: loaded.meta[k] for k in ("tokenizer", "model") if k in loaded.meta}
        return _traced(loaded.model, idx, args, temperature, generator, stop_token, tok, meta)
    new = generate_ids(
        loaded.model, idx, args.max_new_tokens, temperature=temperature, top_k=args.top_k,
        generator=generator, stop_token=stop_token,
    )  # fmt: skip
    text = tok.decode(idx[0].tolist() + new) if loaded.tokenizer else args.prompt + tok.decode(new)
    print(inert_document(text))
    return 0


class _Bytes:
    """The byte tokenizer, for a file model without ``--tokenizer``."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
