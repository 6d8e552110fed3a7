"""The terminal progress bar of the commands: tqdm's, as ``ProgressBar(total, desc)``.

>>> bar = ProgressBar(100, "train")          # doctest: +SKIP
>>> bar.update(1, loss=2.31, tok_s="12.3k")  # doctest: +SKIP
>>> bar.close()                              # doctest: +SKIP

On a terminal it is a ``tqdm`` bar (the one ``transformers`` and PyTorch users already
see), redrawn in place at most every ``min_interval`` seconds, with the values given to
``update`` after the rate. When stderr is not a TTY (CI logs, pipes) tqdm would still
write ``\\r`` redraws, so the same line, formatted by tqdm, is printed as a plain line
every ``log_every`` percent instead, so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from tqdm import tqdm

from tracing.formatting import format_number

BAR_FORMAT = (
    "{desc} {percentage:3.0f}% |{bar:WIDTH}| {n_fmt}/{total_fmt} "
    "[{elapsed}<{remaining}, {rate_fmt}{postfix}]"
)
"""tqdm's line, the description first (``WIDTH``: the bar's, in characters):
``train  42% |████▌     | 420/1000 [00:12<00:17, 35.0it/s, loss=1.23]``."""


class _Tqdm(tqdm):
    """tqdm without its monitor thread (a bar here is redrawn by ``update`` only)."""

    monitor_interval = 0


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
        self.stream = stream if stream is not None else sys.stderr
        self.log_every = log_every
        self.n = 0
        self.postfix: dict[str, Any] = {}
        self.start = time.perf_counter()
        self._format = BAR_FORMAT.replace("WIDTH", str(int(width)))
        self._last_logged_pct = -1.0
        self._closed = False
        try:
            self.tty = bool(self.stream.isatty())
        except (AttributeError, ValueError):
            self.tty = False
        self._bar = (
            _Tqdm(
                total=self.total or None,
                desc=desc,
                file=self.stream,
                mininterval=min_interval,
                miniters=1,
                bar_format=self._format,
                dynamic_ncols=True,
            )
            if self.tty
            else None
        )

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---

    def update(self, n: int = 1, **postfix: Any) -> None:
        """Advance by ``n`` and replace the shown values (``loss=...``) that are given."""
        before = self.n
        self.n = min(self.n + n, self.total) if self.total else self.n + n
        self.postfix.update(postfix)
        if self._bar is not None:
            self._bar.set_postfix_str(self._extras(), refresh=False)
            self._bar.update(self.n - before)
            return
        pct = 100.0 * self.n / self.total if self.total else 0.0
        if pct - self._last_logged_pct >= self.log_every or (
            self.n >= self.total and pct != self._last_logged_pct
        ):
            self._last_logged_pct = pct
            self.stream.write(self.render() + "\n")
            self.stream.flush()

    def write(self, message: str) -> None:
        """Print a line (e.g. an eval result) without garbling the bar."""
        if self._bar is not None:
            self._bar.write(message, file=self.stream)
            return
        self.stream.write(message + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
            return
        if self._last_logged_pct < 0:
            self.stream.write(self.render() + "\n")
        self.stream.flush()

    # ---

    def render(self) -> str:
        """The bar as text, formatted by tqdm: ``train  42% |████▌  | 420/1000 [00:12<00:17,
        35.0it/s, loss=1.23]``."""
        return tqdm.format_meter(
            self.n,
            self.total or None,
            time.perf_counter() - self.start,
            prefix=self.desc,
            postfix=self._extras() or None,
            bar_format=self._format,
        ).rstrip()

    def _extras(self) -> str:
        return " ".join(
            f"{k}={format_number(v) if isinstance(v, float) else v}"
            for k, v in self.postfix.items()
        )
