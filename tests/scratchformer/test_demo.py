"""The bundled demo model really reverses strings, and its attention shows it."""

from __future__ import annotations

import random

import pytest
import torch

from scratchformer import (
    DEMO_PROMPT,
    ByteTokenizer,
    ScaledDotProductAttention,
    demo_checkpoint_path,
    demo_model,
    read_metadata,
)
from scratchformer.tasks import get_task, is_held_out

HELD_OUT_SEED = 12345  # training used seeds 0 (train) and 1 (validation)
N_HELD_OUT = 200


pytestmark = pytest.mark.usefixtures("one_thread")


task = get_task("reverse")
tok = ByteTokenizer()


@pytest.fixture(scope="module")
def model():
    return demo_model()


def test_demo_checkpoint_is_a_small_packaged_resource():
    ref = demo_checkpoint_path()
    assert ref.is_file()
    assert len(ref.read_bytes()) < 5_000_000
    meta = read_metadata(str(ref))
    assert meta["tokenizer"] == "byte" and meta["extra"]["task"] == "reverse"


def test_demo_prompt_is_a_correct_example_of_the_task():
    text, _, _ = DEMO_PROMPT.partition(task.separator)
    assert task.example(text) == DEMO_PROMPT


def test_held_out_strings_are_never_trained_on():
    rng = random.Random(0)  # the training stream's seed
    assert not any(is_held_out(task.random_input(rng)) for _ in range(2000))


def test_demo_reverses_held_out_strings(model):
    rng = random.Random(HELD_OUT_SEED)
    inputs = [task.random_input(rng, held_out=True) for _ in range(N_HELD_OUT)]
    assert all(is_held_out(s) for s in inputs)
    correct, wrong = 0, []
    for n in sorted({len(s) for s in inputs}):  # one batch per length: no padding needed
        group = [s for s in inputs if len(s) == n]
        prompts = torch.tensor([tok.encode(s + "|") for s in group])
        out = model.generate(prompts, max_new_tokens=n + 1, temperature=0)
        for s, row in zip(group, out[:, prompts.size(1) :].tolist()):
            if tok.decode(row) == s[::-1] + ".":
                correct += 1
            else:
                wrong.append((s, tok.decode(row)))
    accuracy = correct / N_HELD_OUT
    print(f"demo held-out exact match: {accuracy:.1%} ({correct}/{N_HELD_OUT}); {wrong[:5]}")
    assert accuracy >= 0.95


def attention_maps(model, text: str) -> dict[str, torch.Tensor]:
    """Attention weights (H, T, T) of every layer, captured with plain forward hooks."""
    maps: dict[str, torch.Tensor] = {}
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, ScaledDotProductAttention):

            def hook(mod, args, output, name=name):
                maps[name] = output[1][0].detach()  # weights of batch row 0: (H, T, T)

            handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(torch.tensor([tok.encode(text)]))
    finally:
        for h in handles:
            h.remove()
    return maps


def test_some_head_attends_along_the_anti_diagonal(model):
    """The answer rows q = n..2n-1 of some head peak on one anti-diagonal k = 2n - 1 - q + c.

    c = 0: the row looks straight at the input letter it is about to write (position
    2n-1-q). c = 1: it looks at the mirror image of the letter it holds (position 2n-q),
    whose left neighbour is the letter to write, copied there by layer 0. Both are the
    task's anti-diagonal; the test accepts either, the same c for every row.
    """
    rng = random.Random(HELD_OUT_SEED + 1)
    texts = [task.random_input(rng, held_out=True) for _ in range(30)]
    texts = [t for t in texts if len(t) >= 4]
    offsets: dict[tuple[str, int], list[int]] = {}
    for text in texts:
        n = len(text)
        for layer, weights in attention_maps(model, task.example(text)).items():
            for head in range(weights.size(0)):
                for q in range(n, 2 * n):  # the rows that produce the reversed string
                    peak = int(weights[head, q].argmax())
                    offsets.setdefault((layer, head), []).append(peak - (2 * n - 1 - q))
    score = {
        (layer, head, c): sum(o == c for o in found) / len(found)
        for (layer, head), found in offsets.items()
        for c in (0, 1)
    }
    best = max(score, key=score.get)
    print(f"anti-diagonal: {best[0]} head {best[1]} offset {best[2]}: {score[best]:.1%} of rows")
    assert score[best] >= 0.9
