"""``scratchformer patch``: an activation patching sweep, as CSV and a PNG heatmap.

    scratchformer patch --clean "wordplay|yalp" --corrupted "workplay|yalp" -o heads.csv
    scratchformer patch --clean ... --corrupted ... --over positions -o pos.csv --png pos.png
    scratchformer patch --clean ... --corrupted ... --site blocks.0.feed_forward --site blocks.1
    scratchformer patch --model ./hf-model --clean "the cat sat" --corrupted "the dog sat" -o h.csv

The corrupted prompt runs once per site (every attention head, every block, every block ×
position, or the ``--site`` list), each time with that site's value taken from the clean
prompt's run. The table holds the metric of each run: the logit of the clean run's next
token minus that of the corrupted run's best other token, at the last position. Both
prompts must have the same number of tokens (bytes). The PNG shows each cell's share of
the way from the corrupted metric (0) to the clean one (1).
"""

from __future__ import annotations

import argparse
import io
import os
from pathlib import Path

from app.commands.checks import output_file, replace_atomically
from app.commands.options import (
    add_command,
    add_model_source,
    load_any_model,
    load_model,
    model_inputs,
    stderr_say,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(
        subparsers, "patch", "activation patching sweep: CSV table and PNG heatmap", __doc__
    )
    add_model_source(p, own_model=True)
    p.add_argument("--clean", required=True, help="the prompt whose values are patched in")
    p.add_argument("--corrupted", required=True, help="the prompt that is run with patches")
    p.add_argument(
        "--over",
        choices=("heads", "layers", "positions"),
        default="heads",
        help="what one run patches (default: heads); --site overrides it",
    )
    p.add_argument(
        "--site",
        action="append",
        metavar="SITE",
        help="patch this site ('blocks.1', 'blocks.0.self_attn.attention:softmax#0'); repeat",
    )
    p.add_argument("-o", "--output", required=True, metavar="CSV", help="table to write")
    p.add_argument("--png", metavar="PNG", help="also write the heatmap as a PNG image")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=run)


def write_png(result, path: Path, title: str) -> None:
    """Render the heatmap without a screen (Qt's offscreen platform when there is none)."""
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    from app.widgets.sweep_heatmap import sweep_image

    # a QApplication (not a QGuiApplication): a later widget in this process needs one
    _app = QApplication.instance() or QApplication(["scratchformer"])
    image = sweep_image(result, title)

    def save(tmp: Path) -> None:
        if not image.save(str(tmp), "PNG"):
            from app.cli import UserError

            raise UserError(f"cannot write the image {path}")

    replace_atomically(path, save)


def run(args: argparse.Namespace) -> int:
    import torch

    from app.cli import UserError
    from app.core.progress import ProgressBar
    from scratchformer import ByteTokenizer
    from tracing.runs.patching import sweep
    from tracing.safe_text import inert

    quiet = args.quiet
    say = stderr_say(quiet)

    output = output_file(args.output, inputs=model_inputs(args))
    png = output_file(args.png, inputs=[*model_inputs(args), output]) if args.png else None
    loaded = load_any_model(args) if args.model else None
    tok = (loaded.tokenizer if loaded is not None else None) or ByteTokenizer()
    unit = "tokens (bytes)" if isinstance(tok, ByteTokenizer) else "tokens"
    clean, corrupted = tok.encode(args.clean), tok.encode(args.corrupted)
    if not clean or not corrupted:
        raise UserError("--clean and --corrupted must both be non-empty")
    if len(clean) != len(corrupted):
        raise UserError(
            f"--clean is {len(clean)} {unit} and --corrupted {len(corrupted)}: "
            "patching needs prompts of the same length"
        )
    model = loaded.model if loaded is not None else load_model(args, say)[0]
    device = getattr(args, "device", "cpu")
    if device == "meta":
        raise UserError("patch --device meta: a meta model computes no metric to patch")
    block_size = getattr(getattr(model, "config", None), "block_size", None)
    if block_size is not None and len(clean) > block_size:
        raise UserError(
            f"the prompts are {len(clean)} tokens; the model's block_size is {block_size}"
        )
    over = args.site if args.site else args.over
    bar: ProgressBar | None = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            stream = io.StringIO() if quiet else None
            bar = ProgressBar(
                total, f"patch over {args.over if not args.site else 'sites'}", stream=stream
            )
        bar.update(1)

    with torch.no_grad():
        result = sweep(
            model,
            torch.tensor([clean], device=device),
            torch.tensor([corrupted], device=device),
            over=over,
            progress=progress,
            token_label=tok.token_str,
        )
    if bar is not None:
        bar.close()
    csv = result.to_csv()
    replace_atomically(output, lambda tmp: tmp.write_text(csv, encoding="utf-8"))
    best = result.best()
    # the labels may be a stranger's tokenizer's strings: made inert for the terminal
    where = f"; largest: {inert(f'{best[0]} {best[1]}')} = {best[2]:.3f}" if best else ""
    print(
        f"wrote {output}: {len(result.rows)}x{len(result.columns)} runs in "
        f"{result.seconds:.1f}s, {result.metric_name} clean {result.clean_metric:.3f} "
        f"corrupted {result.corrupted_metric:.3f}{where}"
    )
    if png is not None:
        write_png(result, png, f"patch {args.corrupted!r} with {args.clean!r} over {result.over}")
        print(f"wrote {png}")
    return 0
