"""A small trace built by hand from ``tracing.record``: no model, no capture engine.

It stands for one forward pass of a two-block toy model and is fully deterministic, so the
golden report files in this folder can be compared byte for byte. It deliberately holds the
awkward cases a writer must survive: text with ``<``, ``&``, quotes and commas, a NaN and an
Inf in the stats, a tensor with unknown dims, a 0-d tensor, an empty tensor, a
non-contiguous value, two records sharing one stored value, and a module that never ran.
"""

from __future__ import annotations

import torch

from tracing.record import ModuleInfo, SourceLocation, Step, TensorRecord, TensorStats, Trace

SRC = "/project/toy/model.py"


def _stats(t: torch.Tensor) -> TensorStats:
    x = t.double()
    finite = x[torch.isfinite(x)]
    return TensorStats(
        min=float(finite.min()) if finite.numel() else float("nan"),
        max=float(finite.max()) if finite.numel() else float("nan"),
        mean=round(float(finite.mean()), 6) if finite.numel() else float("nan"),
        std=round(float(finite.std()), 6) if finite.numel() > 1 else 0.0,
        nan=int(torch.isnan(x).sum()),
        inf=int(torch.isinf(x).sum()),
    )


def handmade_trace(with_values: bool = True) -> Trace:
    """The toy trace. ``with_values=False`` gives the ``stats``-level version."""
    B, T, C, H, D, V = 1, 3, 4, 2, 2, 5

    tokens = torch.tensor([[1, 2, 3]])  # (B, T)
    emb = (torch.arange(B * T * C, dtype=torch.float32).reshape(B, T, C) - 5.0) / 4  # (B, T, C)
    heads = emb.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D), not contiguous
    att = torch.softmax(torch.arange(H * T * T, dtype=torch.float32).reshape(B, H, T, T), -1)
    res = emb + 1.0  # (B, T, C)
    logits = torch.linspace(-2, 2, B * T * V).reshape(B, T, V)
    logits[0, 0, 0] = float("nan")
    logits[0, 1, 1] = float("inf")
    scale = torch.tensor(0.5)  # 0-d
    empty = torch.zeros(0, C)

    values = {
        "t0": tokens,
        "t1": emb,
        "t2": heads,
        "t3": att,
        "t4": res,
        "t5": logits,
        "t6": scale,
        "t7": empty,
    }
    specs = [
        # id, key, dims, producer, role
        (0, "t0", ("B", "T"), None, "input"),
        (1, "t1", ("B", "T", "C"), 2, None),
        (2, "t2", ("B", "H", "T", "D"), 5, None),
        (3, "t3", ("B", "H", "T", "T"), 7, "attention"),
        (4, "t4", ("B", "T", "C"), 8, None),
        (5, "t5", ("B", "T", "V"), 10, None),
        (6, "t6", (), 6, None),
        (7, "t7", None, 11, None),
        (8, "t3", ("B", "H", "T", "T"), 4, "attention"),  # module output = last op output
    ]
    tensors = []
    for tid, key, dims, producer, role in specs:
        v = values[key]
        tensors.append(
            TensorRecord(
                id=tid,
                shape=tuple(v.shape),
                dtype=str(v.dtype).removeprefix("torch."),
                dims=dims,
                stats=_stats(v) if v.is_floating_point() and v.numel() else None,
                value_key=key if with_values or role == "attention" else None,
                producer=producer,
                role=role,
            )
        )

    def src(line: int, text: str, fn: str) -> SourceLocation:
        return SourceLocation(file=SRC, line=line, text=text, function=fn)

    steps = [
        Step(0, "module", "", "ToyNet", None, (0,), (5,), ("idx",), ("output",), 0, None, 11),
        Step(
            1,
            "module",
            "embed",
            "Embedding",
            src(40, "x = self.embed(idx)", "forward"),
            (0,),
            (1,),
            ("input",),
            ("output",),
            1,
            0,
            2,
        ),
        Step(
            2,
            "op",
            "embed",
            "embedding",
            src(12, "return F.embedding(idx, self.weight)", "forward"),
            (0,),
            (1,),
            ("input",),
            ("output",),
            2,
            1,
        ),
        Step(
            3,
            "module",
            "blocks.0",
            "Block",
            src(42, "x = block(x)", "forward"),
            (1,),
            (4,),
            ("x",),
            ("output",),
            1,
            0,
            8,
        ),
        Step(
            4,
            "module",
            "blocks.0.attn",
            "Attention",
            src(21, 'a = self.attn(x, mask="causal")', "forward"),
            (1,),
            (8,),
            ("x",),
            ("output",),
            2,
            3,
            7,
        ),
        Step(
            5,
            "op",
            "blocks.0.attn",
            "transpose",
            src(30, "q = x.view(B, T, H, D).transpose(1, 2)", "split_heads"),
            (1,),
            (2,),
            ("self",),
            ("output",),
            3,
            4,
        ),
        Step(
            6,
            "op",
            "blocks.0.attn",
            "rsqrt",
            src(31, "scale = 1 / D ** 0.5  # <C & D>", "forward"),
            (),
            (6,),
            (),
            ("output",),
            3,
            4,
        ),
        Step(
            7,
            "op",
            "blocks.0.attn",
            "softmax",
            src(32, "w = (q @ k.mT * scale).softmax(-1)", "forward"),
            (2, 6),
            (3,),
            ("self", "scale"),
            ("output",),
            3,
            4,
        ),
        Step(
            8,
            "op",
            "blocks.0",
            "add",
            src(22, 'x = x + a, "residual"', "forward"),
            (1, 8),
            (4,),
            ("self", "other"),
            ("output",),
            2,
            3,
        ),
        Step(
            9,
            "module",
            "head",
            "Linear",
            src(44, "logits = self.head(x)", "forward"),
            (4,),
            (5,),
            ("input",),
            ("output",),
            1,
            0,
            10,
        ),
        Step(
            10,
            "op",
            "head",
            "linear",
            src(50, "return F.linear(x, self.weight)", "forward"),
            (4,),
            (5,),
            ("input",),
            ("output",),
            2,
            9,
        ),
        Step(
            11,
            "op",
            "",
            "new_zeros",
            src(45, "extra = x.new_zeros(0, C)", "forward"),
            (4,),
            (7,),
            ("self",),
            ("output",),
            1,
            0,
        ),
    ]

    modules = {
        "": ModuleInfo("", "ToyNet", None, ("embed", "blocks", "head", "unused"), 0, 49),
        "embed": ModuleInfo("embed", "Embedding", "", (), 20, 20, "5, 4"),
        "blocks": ModuleInfo("blocks", "ModuleList", "", ("blocks.0",), 0, 4),
        "blocks.0": ModuleInfo("blocks.0", "Block", "blocks", ("blocks.0.attn",), 0, 4),
        "blocks.0.attn": ModuleInfo("blocks.0.attn", "Attention", "blocks.0", (), 4, 4, "heads=2"),
        "head": ModuleInfo(
            "head", "Linear", "", (), 20, 20, "in_features=4, out_features=5, bias=False"
        ),
        "unused": ModuleInfo("unused", "Dropout", "", (), 0, 0, "p=0.1"),
    }
    meta = {
        "model_class": "ToyNet",
        "config": {"d_model": C, "n_heads": H, "vocab_size": V, "block_size": 8},
        "dims": {"B": B, "T": T, "C": C, "H": H, "D": D, "V": V},
        "tokens": [1, 2, 3],
        "text": 'a<b & "c"',
        "capture": "values" if with_values else "stats",
        "torch_version": "2.x",
        "shape_tuple": (B, T, C),
    }
    kept = values if with_values else {"t3": att}
    return Trace(steps=steps, modules=modules, tensors=tensors, meta=meta, values=kept)
