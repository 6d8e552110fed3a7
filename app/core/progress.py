"""A small terminal progress bar (no tqdm): ``ProgressBar(total, desc)``.

>>> bar = ProgressBar(100, "train")          # doctest: +SKIP
>>> bar.update(1, loss=2.31, tok_s="12.3k")  # doctest: +SKIP
>>> bar.close()                              # doctest: +SKIP

On a terminal it redraws one line in place (``\\r``), at most ~10 times a second. When
stderr is not a TTY (CI logs, pipes) it prints a plain line every ``log_every`` percent
instead, so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from tracing.formatting import format_number


def _format_duration(seconds: float) -> str:
    seconds = int(seconds)
    m, s = divmod(seconds, 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class ProgressBar:
    """Progress of ``total`` units of work, drawn to ``stream`` (stderr by default)."""

    def __init__(
        self,
        total: int,
        desc: str = "",
        *,
        width: int = 30,
        stream: TextIO | None = None,
        min_interval: float = 0.1,
        log_every: float = 10.0,
    ):
        self.total = max(int(total), 0)
        self.desc = desc
        self.width = width
        self.stream = stream if stream is not None else sys.stderr
        self.min_interval = min_interval
        self.log_every = log_every
        self.n = 0
        self.postfix: dict[str, Any] = {}
        self.start = time.perf_counter()
        self._last_draw = 0.0
        self._last_logged_pct = -1.0
        self._closed = False
        try:
            self.tty = bool(self.stream.isatty())
        except (AttributeError, ValueError):
            self.tty = False

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---

    def update(self, n: int = 1, **postfix: Any) -> None:
        """Advance by ``n`` and replace the shown values (``loss=...``) that are given."""
        self.n = min(self.n + n, self.total) if self.total else self.n + n
        self.postfix.update(postfix)
        now = time.perf_counter()
        if self.tty:
            if now - self._last_draw >= self.min_interval or self.n >= self.total:
                self._draw_tty()
                self._last_draw = now
        else:
            pct = 100.0 * self.n / self.total if self.total else 0.0
            if pct - self._last_logged_pct >= self.log_every or (
                self.n >= self.total and pct != self._last_logged_pct
            ):
                self._last_logged_pct = pct
                self.stream.write(self.render() + "\n")
                self.stream.flush()

    def write(self, message: str) -> None:
        """Print a line (e.g. an eval result) without garbling the bar."""
        if self.tty:
            self.stream.write("\r\x1b[K" + message + "\n")
            self._draw_tty()
        else:
            self.stream.write(message + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.tty:
            self._draw_tty()
            self.stream.write("\n")
        elif self._last_logged_pct < 0:
            self.stream.write(self.render() + "\n")
        self.stream.flush()

    # ---

    def render(self) -> str:
        """The bar as text: ``train  42% |████▌     | 420/1000 [00:12<00:17] loss=1.23``."""
        elapsed = time.perf_counter() - self.start
        frac = self.n / self.total if self.total else 0.0
        filled = int(frac * self.width)
        bar = "█" * filled + " " * (self.width - filled)
        if self.n and self.total:
            remaining = elapsed * (self.total - self.n) / self.n
            timing = f"[{_format_duration(elapsed)}<{_format_duration(remaining)}]"
        else:
            timing = f"[{_format_duration(elapsed)}]"
        extras = " ".join(
            f"{k}={format_number(v) if isinstance(v, float) else v}"
            for k, v in self.postfix.items()
        )
        head = f"{self.desc} " if self.desc else ""
        text = f"{head}{100 * frac:3.0f}% |{bar}| {self.n}/{self.total} {timing}"
        return f"{text} {extras}".rstrip()

    def _draw_tty(self) -> None:
        self.stream.write("\r\x1b[K" + self.render())
        self.stream.flush()
