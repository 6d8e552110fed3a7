"""``tutorial.py`` with its one bug fixed: ``import torch.nn.functional as F``.

The fix a reader makes is that one line; here the tutorial's file is executed again as a
module of its own with ``F`` already bound, so the two files never drift apart.
"""

import importlib.util
from pathlib import Path

import torch.nn.functional as F

_spec = importlib.util.spec_from_file_location(
    "tutorial_fixed_impl", Path(__file__).with_name("tutorial.py")
)
_tutorial = importlib.util.module_from_spec(_spec)
_tutorial.F = F
_spec.loader.exec_module(_tutorial)

TutorialLM = _tutorial.TutorialLM
DecoderBlock = _tutorial.DecoderBlock
MultiHeadAttention = _tutorial.MultiHeadAttention
example_inputs = _tutorial.example_inputs
