"""``scratchformer train --model FILE.py:NAME``: a few steps of AdamW on your own model.

    scratchformer train --model model.py:GPT --text corpus.txt --trace-on-nonfinite -o bad.sft
    scratchformer train --model model.py:GPT --data data.py:get_batch --loss model.py:loss \\
        --trace-step 3 -o step3.sft

The model is built as ``--model`` says (an instance, a class, or a function returning a
model) and trained in train mode; the loss and the batches are read as
``app.core.own_training`` says. ``-o`` is the training-step trace (``--trace-step N``, or
``--trace-on-nonfinite``: the first step whose gradients hold a NaN or an Inf, replayed
from the weights and optimizer state before it). Training stops once the loss is not
finite: there is nothing to learn after it.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any


def _load_object(text: str, what: str) -> tuple[Any, Any]:
    """(module, object) for ``FILE.py:NAME``."""
    from app.cli import UserError
    from app.core.user_model import ModelSpec, import_file

    spec = ModelSpec.parse(text.replace("--model", what))
    module = import_file(spec.file)
    if not hasattr(module, spec.name):
        raise UserError(f"{what} {text}: {spec.file} defines no {spec.name!r}")
    return module, getattr(module, spec.name)


def run_own(args: argparse.Namespace) -> int:
    import torch

    import tracing
    from app.cli import UserError
    from app.commands.checks import input_file, output_file
    from app.core.own_training import LossShapeError, batches, own_loss, plan
    from app.core.user_model import ModelSpec, UserCodeError, build, import_file

    wall_start = time.perf_counter()
    if not args.model:
        raise UserError("--data and --loss go with --model FILE.py:NAME (your own model)")
    if args.task:
        raise UserError("--task trains a built-in model; give --text or --data with --model")
    if not (args.text or args.data):
        raise UserError("--model needs batches: --text FILE or --data FILE.py:NAME")
    if args.trace_step is None and not args.trace_on_nonfinite:
        raise UserError(
            "with --model, -o is the training-step trace: add --trace-step N or "
            "--trace-on-nonfinite"
        )
    if args.trace_step is not None and args.trace_step > args.steps:
        raise UserError(f"--trace-step must be between 1 and --steps ({args.steps})")
    from app.core.model_sources import model_reads

    # FILE.py:NAME: the file and the modules beside it are read
    inputs = [p for text in (args.model, args.data, args.loss) for p in model_reads(text)]
    inputs.append(args.text)
    out = output_file(args.output, inputs=inputs)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    try:
        spec = ModelSpec.parse(args.model)
        module = import_file(spec.file)
        model = build(module, spec.name, spec.file)
        loss_fn = _load_object(args.loss, "--loss")[1] if args.loss else None
        if args.data:
            next_batch = batches(_load_object(args.data, "--data")[1])
        else:
            next_batch = _text_batches(args, model, input_file(args.text, "text file"))
    except UserCodeError as e:
        raise UserError(str(e)) from e
    model.train()
    how = plan(model, loss_fn)
    requests: list[tuple[Any, Path]] = []
    if args.trace_step is not None:
        requests.append((args.trace_step, out))
    if args.trace_on_nonfinite:
        path = out
        if args.trace_step is not None:
            path = out.with_name(f"{out.stem}.nonfinite{out.suffix}")
        requests.append(("nonfinite", output_file(path, inputs=inputs)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    targets: dict[str, Any] = {}
    watch_loss = None
    if how.loss is not None:
        loss_of = how.loss

        def watch_loss(output):  # the loop's current targets, read during the replay
            return loss_of(output, targets["y"])

        watch_loss.__name__ = getattr(loss_fn, "__name__", "next_token_loss")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"training {spec.name} ({n_params:,} parameters) with {how.describe}, lr {args.lr:g}")
    watchers = [
        tracing.watch(model, optimizer, when, path, loss_fn=watch_loss, capture=args.trace_capture)
        for when, path in requests
    ]
    step = 0
    try:
        for step in range(1, args.steps + 1):
            x, y = next_batch(step)
            targets["y"] = y
            optimizer.zero_grad()
            try:
                output = how.call(model, x, y)
                loss = own_loss(output) if how.loss is None else how.loss(output, y)
                if loss is None:
                    raise LossShapeError(
                        "the model was given targets but returned no loss: expected "
                        "(logits, loss), .loss or ['loss']"
                    )
                loss.backward()
                optimizer.step()
            except LossShapeError as e:
                raise UserError(f"step {step}: {e}") from e
            value = float(loss.detach())
            if not args.quiet:
                print(f"step {step}: loss {value:.4f}")
            if not math.isfinite(value):
                print(f"step {step}: the loss is {value}; stopping")
                break
    except BaseException:
        say_written(watchers)  # a replay that raised or exited: its trace is kept, and said
        raise
    finally:
        for w in watchers:
            w.close()
    for w in watchers:
        for path, reason in zip(w.traces, w.reasons):
            print(f"wrote training-step trace {path} ({reason})")
            say_origin(path)
        if not w.traces:
            why = "every gradient stayed finite" if w.when == "nonfinite" else "no such step"
            print(f"no training-step trace written: {why}")
    print(f"done: {step} steps (wall time {time.perf_counter() - wall_start:.1f}s)")
    return 0


def say_written(watchers) -> None:
    """The training-step traces written so far, when training stopped early."""
    for w in watchers:
        for path, reason in zip(w.traces, w.reasons):
            print(f"wrote training-step trace {path} ({reason})", flush=True)


def say_origin(path: Path) -> None:
    """Where the saved step went non-finite, if it did (what N shows in the app)."""
    import tracing
    from tracing.breakpoints import first_nonfinite_gradient
    from tracing.formatting import step_text

    hit = first_nonfinite_gradient(tracing.load(path))
    if hit is not None:  # the step number the app's step bar and Ctrl+G use
        print(f"  went non-finite at trace {step_text(hit.step)}: {hit.label}: {hit.reason}")
        if hit.source:
            print(f"  {hit.source}")
        print(f"  open it: scratchformer app {path}  (then N)")


def _text_batches(args: argparse.Namespace, model: Any, text: Path):
    """Random windows of the text's bytes, ``--block-size`` long (default: the model's
    ``config.block_size``, else 64)."""
    import torch

    from app.cli import UserError
    from app.core.user_model import first_embedding_size
    from scratchformer.tasks import TextDataset

    block = args.block_size or getattr(getattr(model, "config", None), "block_size", None) or 64
    try:
        data = TextDataset(text, block)
    except ValueError as e:
        raise UserError(str(e)) from e
    vocab = first_embedding_size(model)
    top = max(int(data.train_data.max()), int(data.val_data.max()))
    if vocab is not None and top >= vocab:  # checked here, not an IndexError at step 1
        raise UserError(
            f"--text {text.name}: its bytes are token ids up to {top} (a vocabulary of "
            f"{top + 1}; 256 holds any text) but the model's vocabulary (its first "
            f"embedding) has {vocab} entries; build the model with a vocabulary of 256, or "
            f"pass --data FILE.py:NAME giving batches of ids below {vocab}"
        )
    gen = torch.Generator().manual_seed(args.seed)
    return lambda step: data.batch(gen, args.batch_size, "train")
