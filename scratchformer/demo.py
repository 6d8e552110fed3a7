"""The bundled demo: a tiny model trained to reverse strings, shipped in ``resources/``.

Reversal is chosen because its attention can be read at a glance: to write the answer's
j-th character the model must look at the input's (n-1-j)-th character, so in the
attention map of a head doing the work, the answer rows light up along an
**anti-diagonal** (bottom-left block of the map, running from top-right to bottom-left).
The trained model does it in two steps: layer 0 copies each letter one position to the
right, and a layer-1 head looks from each answer letter at the same letter's place in the
input (its mirror image), where the letter to write next has been copied.

The file is found with ``importlib.resources`` so it works from an installed wheel too.
How it was trained (one command, see the README)::

    scratchformer train --task reverse --preset demo --steps 3000 --threads 1 \\
        -o resources/demo.safetensors
"""

from __future__ import annotations

from importlib import resources

from scratchformer.checkpoint import CheckpointError, load_checkpoint

DEMO_CHECKPOINT = "demo.safetensors"

DEMO_TASK = (
    "String reversal. Input: 2 to 16 lowercase letters a-z, then '|'; the model writes "
    "them in reverse order and ends with '.', e.g. 'softmax|xamtfos.'. Look at layer 1's "
    "attention: over the input every row attends to itself (a diagonal); over the answer, "
    "each row looks at the input position of the letter it holds, a mirror image, so the "
    "peaks run along an anti-diagonal. The letter to write next sits just left of that "
    "spot, and layer 0 has already copied each letter one position to the right."
)

DEMO_PROMPT = "wordplay|yalpdrow."
"""A complete example with distinct letters: one forward pass over it shows the
anti-diagonal cleanly (repeated letters would blur it). Its 18 tokens differ from every
size of the demo config (d_head 16, heads 4...), so symbolic dims are never ambiguous."""


def demo_checkpoint_path():
    """A ``Traversable`` for the bundled checkpoint (a real file in a normal install)."""
    return resources.files("scratchformer.resources") / DEMO_CHECKPOINT


def demo_model(device: str = "cpu"):
    """Load the bundled demo model (eval mode). Raises CheckpointError if it is missing."""
    ref = demo_checkpoint_path()
    if not ref.is_file():
        raise CheckpointError(
            f"the bundled demo checkpoint {DEMO_CHECKPOINT!r} is missing from "
            "scratchformer.resources; train it with: scratchformer train --task reverse "
            "--preset demo -o resources/demo.safetensors"
        )
    with resources.as_file(ref) as path:
        return load_checkpoint(path, device=device)
