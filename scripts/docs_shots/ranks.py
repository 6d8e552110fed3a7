"""README screenshots (ranks): the demo model under DDP on 2 ranks.

``ranks.png``: rank 1's weight drifted, the view on the first op that reads it.
``ranks_step.png``: a traced training step, each rank its own batch, the view on one of the
backward's gradient-bucket all-reduces.

torchrun --nproc_per_node 2 scripts/docs_shots/ranks.py make /tmp/ranks   # rank files
xvfb-run -a .venv/bin/python scripts/docs_shots/ranks.py shot /tmp/ranks docs/ranks.png
torchrun --nproc_per_node 2 scripts/docs_shots/ranks.py make-step /tmp/ranks
xvfb-run -a .venv/bin/python scripts/docs_shots/ranks.py shot-step /tmp/ranks \\
    docs/ranks_step.png
"""

import sys
from pathlib import Path

import torch


def _ddp_demo(**options):
    """Join the torchrun group; the demo model in DDP."""
    from torch.nn.parallel import DistributedDataParallel

    import scratchformer
    from tracing.capture.distributed import join_from_environment

    join_from_environment()
    torch.set_num_threads(1)
    return DistributedDataParallel(scratchformer.demo_model(), **options)


def _leave() -> None:
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def make(folder: Path) -> None:
    """On each rank: the demo model in DDP, one weight of rank 1 nudged, traced."""
    import scratchformer
    import tracing

    ddp = _ddp_demo()
    if torch.distributed.get_rank() == 1:  # after DDP's start-up broadcast: a real drift
        with torch.no_grad():
            ddp.module.get_submodule("blocks.1.feed_forward.linear1").weight[5, 7] += 0.5
    tok = scratchformer.ByteTokenizer()
    ids = tok.encode(scratchformer.DEMO_PROMPT)
    meta = {"tokens": ids, "text": scratchformer.DEMO_PROMPT}
    tracing.trace(ddp, torch.tensor([ids]), capture="values", meta=meta, out=folder / "demo.sft")
    _leave()


def make_step(folder: Path) -> None:
    """On each rank: one SGD step of the demo model in DDP, traced, on its own text."""
    import scratchformer
    import tracing

    ddp = _ddp_demo(bucket_cap_mb=0.1)
    ddp.train()
    sgd = torch.optim.SGD(ddp.parameters(), lr=0.01)
    text = ["abcdef|fedcba.", "planet|tenalp."][torch.distributed.get_rank()]
    ids = torch.tensor([scratchformer.ByteTokenizer().encode(text)])

    def loss_fn(logits, targets):
        return torch.nn.functional.cross_entropy(logits[0, :-1], targets[0, 1:])

    for _ in range(2):  # the first step lets DDP rebuild its buckets in gradient order
        sgd.zero_grad()
        loss_fn(ddp(ids), ids).backward()
        sgd.step()
    sgd.zero_grad()
    meta = {"tokens": ids[0].tolist(), "text": text}
    tracing.trace_step(ddp, ids, loss_fn, sgd, targets=ids, capture="values", meta=meta,
                       out=folder / "step.sft")  # fmt: skip
    _leave()


def _window(path: Path, width: int):
    """The app (themed) and the rank window on ``path``'s rank files, shown."""
    from PySide6.QtWidgets import QApplication

    app = QApplication(sys.argv[:1])
    from app.theme import apply_theme

    apply_theme(app)
    from app.windows.rank_window import RankWindow

    w = RankWindow.from_files(path)
    w.resize(width, 960)
    w.show()
    for _ in range(10):
        app.processEvents()
    return app, w


def shot(folder: Path, out: Path) -> None:
    app, w = _window(folder / "demo.sft", 1760)
    first = w.ranks.first
    for path in ("module.blocks.1", "module.blocks.1.feed_forward"):
        w.compare.diagram_a.expand(first.module_steps(path)[0].index)
    w.compare.go_to(0)  # away and back, so both diagrams scroll to the step
    w.go_to_first_divergence()
    for _ in range(30):
        app.processEvents()
    w.grab().save(str(out))


def shot_step(folder: Path, out: Path) -> None:
    app, w = _window(folder / "step.sft", 2000)  # the compare view takes ~1320
    w.splitter.setSizes([1320, 680])  # room for the collectives' detail column
    w.tabs.setCurrentWidget(w.collectives)
    table = w.collectives
    row = next(r for r in range(table.rowCount()) if "bucket 2" in table.item(r, 4).text())
    table.selectRow(row)
    w._on_collective(row, 0)
    for _ in range(30):
        app.processEvents()
    w.grab().save(str(out))


if __name__ == "__main__":
    command, *paths = sys.argv[1:]
    {"make": make, "make-step": make_step, "shot": shot, "shot-step": shot_step}[command](
        *map(Path, paths)
    )
