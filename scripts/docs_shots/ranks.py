"""README screenshot (ranks): the demo model under DDP on 2 ranks, rank 1's weight drifted.

torchrun --nproc_per_node 2 scripts/docs_shots/ranks.py make /tmp/ranks   # rank files
xvfb-run -a .venv/bin/python scripts/docs_shots/ranks.py shot /tmp/ranks docs/ranks.png
"""

import sys
from pathlib import Path

import torch


def make(folder: Path) -> None:
    """On each rank: the demo model in DDP, one weight of rank 1 nudged, traced."""
    from torch.nn.parallel import DistributedDataParallel

    import scratchformer
    import tracing
    from tracing.distributed import join_from_environment

    join_from_environment()
    torch.set_num_threads(1)
    ddp = DistributedDataParallel(scratchformer.demo_model())
    if torch.distributed.get_rank() == 1:  # after DDP's start-up broadcast: a real drift
        with torch.no_grad():
            ddp.module.get_submodule("blocks.1.feed_forward.linear1").weight[5, 7] += 0.5
    tok = scratchformer.ByteTokenizer()
    ids = tok.encode(scratchformer.DEMO_PROMPT)
    meta = {"tokens": ids, "text": scratchformer.DEMO_PROMPT}
    tracing.trace(ddp, torch.tensor([ids]), capture="values", meta=meta, out=folder / "demo.sft")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def shot(folder: Path, out: Path) -> None:
    from PySide6.QtWidgets import QApplication

    app = QApplication(sys.argv[:1])
    from app.theme import apply_theme

    apply_theme(app)
    from app.windows.rank_window import RankWindow

    w = RankWindow.from_files(folder / "demo.sft")
    w.resize(1760, 960)
    w.show()
    for _ in range(10):
        app.processEvents()
    first = w.ranks.first
    for path in ("module.blocks.1", "module.blocks.1.feed_forward"):
        w.compare.diagram_a.expand(first.module_steps(path)[0].index)
    w.compare.go_to(0)  # away and back, so both diagrams scroll to the step
    w.go_to_first_divergence()
    for _ in range(30):
        app.processEvents()
    w.grab().save(str(out))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(Path(sys.argv[2]))
    else:
        shot(Path(sys.argv[2]), Path(sys.argv[3]))
