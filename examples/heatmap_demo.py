"""A small, runnable HeatmapView example: a causal attention pattern over a short prompt.

Run it::

    python examples/heatmap_demo.py                      # opens a window
    python examples/heatmap_demo.py --screenshot out.png # saves a picture and exits

It shows the three things every heatmap in Scratchformer does: row 0 on top (a matrix,
not a plot), the prompt's tokens on both axes, and a colour bar. The map is built by hand:
each query position attends mostly to itself and to the first token, and never to the
future (the causal mask), so you can check the picture against the code.
"""

from __future__ import annotations

import argparse
import sys

import torch


def example_attention(text: str) -> torch.Tensor:
    """A hand-made causal attention map ``(T, T)``: rows sum to 1, zero above the diagonal."""
    T = len(text)
    scores = torch.full((T, T), -2.0)
    scores.fill_diagonal_(2.0)  # look at yourself
    scores[:, 0] = 1.0  # and at the start
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(future, float("-inf"))  # (T, T), causal
    return torch.softmax(scores, dim=-1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", default="hello world")
    parser.add_argument("--screenshot", help="save the window to this PNG and exit")
    args = parser.parse_args(argv)

    from PySide6.QtCore import QCoreApplication, QEvent
    from PySide6.QtWidgets import QApplication

    from app.widgets.heatmap import HeatmapView
    from app.widgets.tensor_view import token_label

    app = QApplication.instance() or QApplication(sys.argv[:1])
    tokens = [token_label(b) for b in args.text.encode("utf-8")]
    view = HeatmapView()
    view.setWindowTitle("Scratchformer · heatmap demo")
    view.resize(560, 500)
    view.set_matrix(
        example_attention(args.text),
        row_labels=tokens,
        col_labels=tokens,
        row_name="query",
        col_name="key",
        scale="probability",
        square=True,
    )
    view.show()
    if args.screenshot:
        app.processEvents()
        view.grab().save(args.screenshot)
        status = 0
    else:
        status = app.exec()
    # delete the widget before the interpreter tears Qt down (avoids a crash at exit)
    view.close()
    view.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    return status


if __name__ == "__main__":
    sys.exit(main())
