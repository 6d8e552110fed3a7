"""Built-in synthetic tasks and a byte-level text dataset, both yielding (x, y) batches.

A synthetic task writes examples like ``"abcde|edcba."``: an input of random letters, a
separator ``|``, the answer, and an end marker ``.``. The loss counts only the answer (the
input is random, so predicting it is pointless): targets before the answer are -100,
which ``cross_entropy(ignore_index=-100)`` skips.

Held-out examples are never trained on: a string is "held out" when a hash of it falls in
a fixed bucket (``is_held_out``). Training skips those strings and evaluation draws only
those, so the accuracy measured on them is on strings the model has never seen.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from scratchformer.tokenizer import ByteTokenizer

IGNORE = -100
HELD_OUT_BUCKETS = 10  # 1 string in 10 is held out


def is_held_out(text: str) -> bool:
    """True for the ~10% of input strings reserved for evaluation (a stable hash)."""
    return zlib.crc32(text.encode("utf-8")) % HELD_OUT_BUCKETS == 0


# --- synthetic tasks


@dataclass(frozen=True)
class SequenceTask:
    """``input|answer.`` examples where ``answer = transform(input)``."""

    name: str
    transform: Callable[[str], str]
    min_len: int = 2
    max_len: int = 16
    alphabet: str = "abcdefghijklmnopqrstuvwxyz"
    separator: str = "|"
    end: str = "."

    @property
    def max_tokens(self) -> int:
        """Length of the longest full example (input, separator, answer, end)."""
        return 2 * self.max_len + 2

    def random_input(self, rng: random.Random, held_out: bool = False) -> str:
        """A random input string, drawn from the training or the held-out part."""
        while True:
            n = rng.randint(self.min_len, self.max_len)
            text = "".join(rng.choice(self.alphabet) for _ in range(n))
            if is_held_out(text) == held_out:
                return text

    def prompt(self, text: str) -> str:
        return text + self.separator

    def answer(self, text: str) -> str:
        return self.transform(text) + self.end

    def example(self, text: str) -> str:
        return self.prompt(text) + self.answer(text)

    def encode(self, text: str) -> tuple[list[int], list[int]]:
        """Token ids ``x`` and next-token targets ``y`` (-100 outside the answer)."""
        ids = ByteTokenizer().encode(self.example(text))
        answer_start = len(self.prompt(text).encode("utf-8"))  # index of 1st answer token
        x = ids[:-1]
        # position p predicts ids[p + 1]; that is an answer token when p + 1 >= answer_start
        y = [t if p + 1 >= answer_start else IGNORE for p, t in enumerate(ids[1:])]
        return x, y

    def batch(
        self, rng: random.Random, batch_size: int, held_out: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), both (B, T) int64, right-padded (padding targets are -100)."""
        pairs = [self.encode(self.random_input(rng, held_out)) for _ in range(batch_size)]
        T = max(len(x) for x, _ in pairs)
        pad = ord(self.end)
        x = torch.full((batch_size, T), pad, dtype=torch.long)
        y = torch.full((batch_size, T), IGNORE, dtype=torch.long)
        for i, (xs, ys) in enumerate(pairs):
            x[i, : len(xs)] = torch.tensor(xs)
            y[i, : len(ys)] = torch.tensor(ys)
        return x, y


TASKS: dict[str, SequenceTask] = {
    "reverse": SequenceTask("reverse", lambda s: s[::-1]),
    "copy": SequenceTask("copy", lambda s: s),
}


def get_task(name: str) -> SequenceTask:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {sorted(TASKS)}")
    return TASKS[name]


@torch.no_grad()
def exact_match_accuracy(
    model, task: SequenceTask, n_examples: int = 200, seed: int = 12345
) -> tuple[float, list[tuple[str, str, str]]]:
    """Greedy-decode ``n_examples`` held-out inputs; return (accuracy, failures).

    Each failure is ``(input, expected answer, model's answer)``.
    """
    model.eval()
    tok = ByteTokenizer()
    rng = random.Random(seed)
    inputs = [task.random_input(rng, held_out=True) for _ in range(n_examples)]
    by_length: dict[int, list[str]] = {}
    for text in inputs:
        by_length.setdefault(len(text), []).append(text)
    correct, failures = 0, []
    for n, texts in sorted(by_length.items()):  # same length -> one batch, no padding
        prompts = torch.tensor([tok.encode(task.prompt(t)) for t in texts])
        out = model.generate(prompts, max_new_tokens=n + len(task.end), temperature=0)
        for text, row in zip(texts, out[:, prompts.size(1) :].tolist()):
            got, want = tok.decode(row), task.answer(text)
            if got == want:
                correct += 1
            else:
                failures.append((text, want, got))
    return correct / n_examples, failures


# --- byte-level text


class TextDataset:
    """Random windows of a text file's UTF-8 bytes; the last 10% is the validation split."""

    def __init__(self, path: str | Path, block_size: int):
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"text file not found: {path}")
        data = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8).long()
        if len(data) < 2 * (block_size + 1):
            raise ValueError(
                f"{path} has {len(data)} bytes; need at least {2 * (block_size + 1)} "
                f"for block_size {block_size}"
            )
        split = max(int(len(data) * 0.9), len(data) - max(len(data) // 10, block_size + 1))
        self.train_data, self.val_data = data[:split], data[split:]
        self.block_size = min(block_size, len(self.val_data) - 1)

    def batch(
        self, generator: torch.Generator, batch_size: int, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        data = self.train_data if split == "train" else self.val_data
        T = self.block_size
        starts = torch.randint(len(data) - T, (batch_size,), generator=generator)
        x = torch.stack([data[s : s + T] for s in starts.tolist()])  # (B, T)
        y = torch.stack([data[s + 1 : s + 1 + T] for s in starts.tolist()])  # (B, T)
        return x, y
