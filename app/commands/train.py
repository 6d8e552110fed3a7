"""``scratchformer train``: train a model on a built-in task or a text file.

    scratchformer train --task reverse --preset demo --steps 3000 -o resources/demo.safetensors
    scratchformer train --text corpus.txt --preset nano --steps 2000 -o nano.safetensors
    scratchformer train --task reverse --steps 500 -o m.safetensors --trace-on-nonfinite
    scratchformer train --model examples/nanogpt_nan/model.py:GPT \
        --data examples/nanogpt_nan/data.py:get_batch --lr 1e14 --trace-on-nonfinite -o bad.sft

``--trace-step N`` saves a training-step trace (forward, backward, gradients, update
ratios) of step N; ``--trace-on-nonfinite`` saves one of the first step whose gradients
hold a NaN or an Inf, replayed from the weights and optimizer state before it. Open
either with ``scratchformer app FILE``.

Shows a progress bar (loss, tokens/s), evaluates every ``--eval-interval`` steps on fixed
validation batches, and writes the checkpoint every ``--checkpoint-interval`` steps and at
the end. For a task it finally reports exact-match accuracy on held-out strings.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from app.commands.checks import (
    SEED,
    THREADS,
    float_between,
    input_file,
    int_between,
    output_file,
)
from app.commands.options import add_command

SIZE = int_between(1, 1 << 20)
COUNT = int_between(1, 10**9)
MAX_TEXT_BYTES = 1 << 30
"""Largest --text file (it is held in memory as int64 token ids: 8 bytes a byte)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(
        subparsers, "train", "train a model on a synthetic task or a text file", __doc__
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--task", choices=("reverse", "copy"), help="built-in synthetic task")
    source.add_argument("--text", metavar="FILE", help="train a byte-level LM on this file")
    source.add_argument(
        "--data", metavar="FILE.py:NAME", help="with --model: (inputs, targets) batches"
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        help="checkpoint to write (.safetensors); with --model, the training-step trace",
    )
    own = p.add_argument_group("your own model (see app/core/own_training.py)")
    own.add_argument("--model", metavar="FILE.py:NAME", help="train this model instead")
    own.add_argument("--loss", metavar="FILE.py:NAME", help="loss(output, targets) -> scalar")
    p.add_argument("--preset", default="demo", help="model preset (demo, nano, gpt2-small)")
    model = p.add_argument_group("model overrides")
    for flag in ("block-size", "d-model", "n-heads", "n-layers", "d-ff"):
        model.add_argument(f"--{flag}", type=SIZE)
    model.add_argument("--dropout", type=float_between(0, 0.99))
    model.add_argument("--activation", choices=("gelu", "relu"))
    model.add_argument("--norm-position", choices=("pre", "post"))
    model.add_argument("--positional", choices=("learned", "sinusoidal"))
    opt = p.add_argument_group("optimisation")
    opt.add_argument("--steps", type=COUNT, default=3000)
    opt.add_argument("--batch-size", type=SIZE, default=64)
    lr = float_between(0, 1e300, low_open=True)
    opt.add_argument("--lr", type=lr, default=3e-3, help="peak learning rate")
    opt.add_argument("--warmup", type=int_between(0, 10**9), default=100, help="warm-up steps")
    opt.add_argument("--eval-interval", type=COUNT, default=250)
    opt.add_argument("--checkpoint-interval", type=COUNT, default=1000)
    opt.add_argument("--seed", type=SEED, default=0)
    opt.add_argument("--threads", type=THREADS, help="torch CPU threads (default: torch's choice)")
    opt.add_argument("--quiet", action="store_true", help="no progress bar")
    tr = p.add_argument_group("training-step traces")
    tr.add_argument(
        "--trace-step", type=COUNT, metavar="N", help="save a trace of step N (1 = first)"
    )
    tr.add_argument(
        "--trace-on-nonfinite",
        action="store_true",
        help="save a trace of the first step whose gradients hold a NaN or an Inf",
    )
    tr.add_argument(
        "--trace-out",
        metavar="PATH",
        help="where (default: beside the checkpoint, NAME.stepN.trace / NAME.nonfinite.trace)",
    )
    tr.add_argument("--trace-capture", choices=("shapes", "stats", "values"), default="stats")
    p.set_defaults(func=run)


def _trace_requests(args: argparse.Namespace) -> list[tuple[object, Path]]:
    """(when, path) for each training-step trace asked for on the command line."""
    from app.cli import UserError

    out = Path(args.output)
    requests: list[tuple[object, Path]] = []
    if args.trace_step is not None:
        if not 1 <= args.trace_step <= args.steps:
            raise UserError(f"--trace-step must be between 1 and --steps ({args.steps})")
        default = out.with_name(f"{out.stem}.step{args.trace_step}.trace")
        requests.append(
            (args.trace_step, output_file(args.trace_out or default, inputs=[args.text, out]))
        )
    if args.trace_on_nonfinite:
        path = Path(args.trace_out or out.with_name(f"{out.stem}.nonfinite.trace"))
        if args.trace_step is not None and args.trace_out:
            path = path.with_name(f"{path.stem}.nonfinite{path.suffix}")
        requests.append(("nonfinite", output_file(path, inputs=[args.text, out])))
    return requests


def run(args: argparse.Namespace) -> int:
    import random

    import torch

    from app.cli import UserError
    from app.core.progress import ProgressBar
    from scratchformer import ByteTokenizer, DecoderOnlyTransformer, ModelConfig
    from scratchformer.tasks import TextDataset, exact_match_accuracy, get_task
    from scratchformer.training import TrainConfig, train

    if args.model or args.data or args.loss:
        from app.commands.train_own import run_own

        return run_own(args)
    wall_start = time.perf_counter()
    # --- paths and sizes, checked before any work (nothing is created but the checkpoint)
    output_file(args.output, inputs=[args.text])
    _trace_requests(args)  # their paths too
    if args.text:
        size = input_file(args.text, "text file").stat().st_size
        if size > MAX_TEXT_BYTES:
            raise UserError(f"{args.text} is {size:,} bytes; --text takes up to {MAX_TEXT_BYTES:,}")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    # --- the model
    overrides = {
        field: getattr(args, field)
        for field in (
            "block_size",
            "d_model",
            "n_heads",
            "n_layers",
            "d_ff",
            "dropout",
            "activation",
            "norm_position",
            "positional",
        )
        if getattr(args, field) is not None
    }
    if args.preset not in ModelConfig.PRESETS:
        raise UserError(
            f"unknown preset {args.preset!r}; choose one of {', '.join(ModelConfig.PRESETS)}"
        )
    config = ModelConfig.preset(args.preset, **overrides)
    _check_memory(config, args.batch_size)
    if config.vocab_size != ByteTokenizer.vocab_size:
        raise UserError(
            f"training uses the byte tokenizer (vocab 256); preset {args.preset!r} has "
            f"vocab_size {config.vocab_size}"
        )

    # --- the data
    meta: dict = {"seed": args.seed, "steps": args.steps}
    if args.task:
        task = get_task(args.task)
        if config.block_size < task.max_tokens:
            raise UserError(
                f"task {task.name!r} needs block_size >= {task.max_tokens}, got {config.block_size}"
            )
        rng = random.Random(args.seed)
        eval_rng = random.Random(args.seed + 1)  # validation batches: a separate stream

        def next_batch():
            return task.batch(rng, args.batch_size)

        eval_set = [task.batch(eval_rng, args.batch_size, held_out=True) for _ in range(8)]
        meta["task"] = task.name
        source = f"task {task.name!r}"
    else:
        data = TextDataset(args.text, config.block_size)
        gen = torch.Generator().manual_seed(args.seed)
        eval_gen = torch.Generator().manual_seed(args.seed + 1)

        def next_batch():
            return data.batch(gen, args.batch_size, "train")

        eval_set = [data.batch(eval_gen, args.batch_size, "val") for _ in range(8)]
        meta["text"] = str(args.text)
        source = f"{args.text} ({len(data.train_data):,} training bytes)"

    model = DecoderOnlyTransformer(config)
    print(
        f"training {model.num_parameters():,}-parameter model ({args.preset}) on {source} "
        f"for {args.steps} steps, {torch.get_num_threads()} threads"
    )
    train_config = TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup_steps=args.warmup,
        eval_interval=args.eval_interval,
        checkpoint_interval=args.checkpoint_interval,
    )

    # --- train, drawing progress
    bar = ProgressBar(args.steps, "train", stream=None) if not args.quiet else None

    def on_step(step: int, loss: float, tok_s: float, lr: float) -> None:
        if bar is not None:
            bar.update(1, loss=loss, tok_s=f"{tok_s / 1000:.1f}k", lr=f"{lr:.1e}")

    def on_eval(step: int, eval_loss: float) -> None:
        message = f"step {step}: eval loss {eval_loss:.4f}"
        if bar is not None:
            bar.write(message)
        else:
            print(message)

    watchers = []

    def on_start(optimizer) -> None:
        for when, path in _trace_requests(args):
            watchers.append(tracing.watch(model, optimizer, when, path, capture=args.trace_capture))

    import tracing

    try:
        result = train(
            model,
            next_batch,
            eval_set,
            train_config,
            checkpoint_path=args.output,
            checkpoint_meta=meta,
            on_step=on_step,
            on_eval=on_eval,
            on_start=on_start,
        )
    except BaseException:
        from app.commands.train_own import say_written

        if bar is not None:
            bar.close()
            bar = None
        say_written(watchers)  # a replay that raised or exited: its trace is kept, and said
        raise
    finally:
        if bar is not None:
            bar.close()
        for w in watchers:
            w.close()
    from app.commands.train_own import say_origin

    for w in watchers:
        for path, reason in zip(w.traces, w.reasons):
            print(f"wrote training-step trace {path} ({reason})")
            say_origin(path)
        if not w.traces:
            why = "every gradient stayed finite" if w.when == "nonfinite" else "no such step"
            print(f"no training-step trace written: {why}")

    print(
        f"done: {result.steps} steps in {result.seconds:.1f}s "
        f"({result.tokens / max(result.seconds, 1e-9):,.0f} tokens/s), "
        f"final eval loss {result.eval_losses[-1][1]:.4f}"
    )
    if args.task:
        accuracy, failures = exact_match_accuracy(model, task, n_examples=200)
        print(f"held-out exact match: {accuracy:.1%} of 200 unseen strings")
        for text, want, got in failures[:3]:
            print(f"  {task.prompt(text)}  expected {want!r}  got {got!r}")
        meta["held_out_accuracy"] = accuracy
        from scratchformer import save_checkpoint

        save_checkpoint(
            model,
            args.output,
            extra_meta={**meta, "step": result.steps, "eval_loss": result.eval_losses[-1][1]},
        )
    print(f"wrote {args.output} (wall time {time.perf_counter() - wall_start:.1f}s)")
    return 0


def training_bytes(config, batch_size: int) -> int:
    """A rough count of the bytes one training step needs: weights, gradients and two
    Adam moments (4 copies), plus the activations autograd keeps for the backward pass.
    Rough on purpose: it tells a run that fits from one that cannot."""
    C, F, L, V, T = (
        config.d_model,
        config.d_ff,
        config.n_layers,
        config.vocab_size,
        config.block_size,
    )
    H = config.n_heads
    params = V * C + T * C + L * (4 * C * C + 2 * C * F + 4 * C) + 2 * C
    per_token = L * (16 * C + 2 * F + 3 * H * T) + 3 * V
    return 4 * (4 * params + batch_size * T * per_token)


def _check_memory(config, batch_size: int) -> None:
    from app.cli import UserError

    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return
    need = training_bytes(config, batch_size)
    if need > total:
        raise UserError(
            f"this model at --batch-size {batch_size} needs about {need / 2**30:,.0f} GiB to "
            f"train; this machine has {total / 2**30:,.0f} GiB (lower --batch-size or the sizes)"
        )
