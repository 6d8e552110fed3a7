"""Each op shape rule of :mod:`tracing.dims.naming`, alone, on hand-built records.

No model runs here: a few steps and tensor records are written out by hand, with the
evidence :func:`tracing.dims.naming.name_axes` reads (letter sizes, and an inputs pass
where a name must move), and the names it gives are checked. Each test builds the sizes
so that only the rule can give the name: where two letters share a size, a name by size
alone would be ``?`` (or wrong), and the rule must carry it from the input's axis.
"""

from __future__ import annotations

from tracing.dim_legend import proof_text
from tracing.dims.contracts import Contract
from tracing.dims.evidence import Evidence, Pass
from tracing.dims.letters import Sized
from tracing.dims.naming import name_axes
from tracing.record import SourceLocation, Step, TensorRecord

SIZES = {"B": 2, "T": 5, "C": 12, "H": 3, "D": 4, "F": 20, "V": 7}
MOVED = {"B": 3, "T": 9}  # the inputs pass: B and T move, the rest stay


class Walk:
    """A hand-written trace: an input, then ops, each with its output shapes (and the
    shapes of the inputs pass, derived by replacing B and T sizes where asked)."""

    def __init__(self, sizes=SIZES, moved=MOVED, params=None):
        self.sizes, self.moved = dict(sizes), dict(moved)
        self.steps: list[Step] = []
        self.tensors: list[TensorRecord] = []
        self.other: list[tuple[int, ...] | None] = []
        self.paths: dict[int, str] = {}
        self.contracts: dict = {}  # parameter path -> what sizes each axis (torch's layers)

    def tensor(self, shape, other=None, role=None, producer=None) -> int:
        rid = len(self.tensors)
        self.tensors.append(
            TensorRecord(rid, tuple(shape), "float32", role=role, producer=producer)
        )
        self.other.append(tuple(other) if other is not None else None)
        return rid

    def input(self, shape, other) -> int:
        return self.tensor(shape, other, role="input")

    def param(self, shape, path: str) -> int:
        rid = self.tensor(shape, shape, role="param")
        self.paths[rid] = path
        return rid

    def op(self, op: str, inputs, shapes, others=None, text: str = "", module: str = "m"):
        index = len(self.steps)
        others = others or [None] * len(shapes)
        outs = tuple(self.tensor(s, o, producer=index) for s, o in zip(shapes, others))
        source = SourceLocation("model.py", index + 1, text)
        self.steps.append(
            Step(index, "op", module, op, source, tuple(inputs), outs, depth=1, parent=None)
        )
        return outs if len(outs) > 1 else outs[0]

    def names(self) -> list:
        letters = {k: Sized(v, f"config.{k}") for k, v in self.sizes.items()}
        letters["B"] = Sized(self.sizes["B"], "input: the first input's axis 0")
        if "T" in self.sizes:
            letters["T"] = Sized(self.sizes["T"], "input: the first input's axis 1")
        inputs = Pass("inputs", "device", {**self.sizes, **self.moved}, self.other)
        evidence = Evidence(
            letters=letters, inputs=inputs, param_paths=self.paths, contracts=self.contracts
        )
        named, _ = name_axes(self.steps, self.tensors, evidence)
        return [r.dims for r in named]


def test_linear_takes_the_input_axes_and_the_weight_rows():
    w = Walk()
    x = w.input((2, 5, 12), (3, 9, 12))
    weight, bias = w.param((20, 12), "fc.weight"), w.param((20,), "fc.bias")
    y = w.op("linear", [x, weight, bias], [(2, 5, 20)], [(3, 9, 20)])
    names = w.names()
    assert names[weight] == ("F", "C") and names[y] == ("B", "T", "F")


def test_view_splits_a_width_into_heads_and_head_width_and_merges_them_back():
    w = Walk(sizes={**SIZES, "T": 4})  # T == D: only the split tells the head width
    x = w.input((2, 4, 12), (3, 9, 12))
    heads = w.op("view", [x], [(2, 4, 3, 4)], [(3, 9, 3, 4)], "x.view(b, t, self.n_heads, -1)")
    back = w.op("reshape", [heads], [(2, 4, 12)], [(3, 9, 12)])
    names = w.names()
    assert names[heads] == ("B", "T", "H", "D") and names[back] == ("B", "T", "C")


def test_view_merges_batch_and_tokens():
    w = Walk()
    x = w.input((2, 5, 12), (3, 9, 12))
    flat = w.op("view", [x], [(10, 12)], [(27, 12)])
    assert w.names()[flat] == ("B·T", "C")


def test_transpose_moves_names_by_the_axes_its_line_writes():
    w = Walk(sizes={**SIZES, "T": 4})  # (B, H, T, D) with T == D: sizes cannot say which
    x = w.input((2, 4, 12), (3, 9, 12))
    heads = w.op("view", [x], [(2, 4, 3, 4)], [(3, 9, 3, 4)])
    moved = w.op("transpose", [heads], [(2, 3, 4, 4)], [(3, 3, 9, 4)], "q.transpose(1, 2)")
    keys_t = w.op("transpose", [moved], [(2, 3, 4, 4)], [(3, 3, 4, 9)], "k.transpose(-2, -1)")
    names = w.names()
    assert names[moved] == ("B", "H", "T", "D")
    assert names[keys_t] == ("B", "H", "D", "T")


def test_matmul_keeps_the_rows_of_its_left_and_the_columns_of_its_right():
    w = Walk(sizes={**SIZES, "T": 4})
    x = w.input((2, 4, 12), (3, 9, 12))
    heads = w.op("view", [x], [(2, 4, 3, 4)], [(3, 9, 3, 4)])
    q = w.op("transpose", [heads], [(2, 3, 4, 4)], [(3, 3, 9, 4)], "q.transpose(1, 2)")
    kt = w.op("transpose", [q], [(2, 3, 4, 4)], [(3, 3, 4, 9)], "k.transpose(-2, -1)")
    scores = w.op("matmul", [q, kt], [(2, 3, 4, 4)], [(3, 3, 9, 9)])
    assert w.names()[scores] == ("B", "H", "T", "T")


def test_a_broadcasting_op_keeps_the_names_of_aligned_axes():
    w = Walk()
    x = w.input((2, 5, 12), (3, 9, 12))
    scale = w.param((12,), "norm.weight")
    y = w.op("mul", [x, scale], [(2, 5, 12)], [(3, 9, 12)])
    assert w.names()[y] == ("B", "T", "C")


def test_split_names_each_part_of_a_fused_width():
    w = Walk()
    x = w.input((2, 5, 12), (3, 9, 12))
    weight = w.param((36, 12), "qkv.weight")
    fused = w.op("linear", [x, weight], [(2, 5, 36)], [(3, 9, 36)])
    parts = w.op("split", [fused], [(2, 5, 12)] * 3, [(3, 9, 12)] * 3, "qkv.split(C, dim=2)")
    names = w.names()
    assert names[fused] == ("B", "T", "3C")
    assert [names[p] for p in parts] == [("B", "T", "C")] * 3


def test_cat_adds_up_its_parts():
    w = Walk()
    x = w.input((2, 5, 12), (3, 9, 12))
    heads = w.op("view", [x], [(2, 5, 3, 4)], [(3, 9, 3, 4)])
    half = w.op(
        "getitem", [heads], [(2, 5, 3, 2)], [(3, 9, 3, 2)], "x1 = x[..., : x.shape[-1] // 2]"
    )
    whole = w.op(
        "cat", [half, half], [(2, 5, 3, 4)], [(3, 9, 3, 4)], "torch.cat((-x2, x1), dim=-1)"
    )
    names = w.names()
    assert names[half][-1] == "D/2" and names[whole][-1] == "D"


def test_a_conv_carries_the_batch_and_the_weights_out_channels_never_the_image_channels():
    w = Walk(sizes={"B": 2, "C": 12, "H": 3, "D": 4}, moved={"B": 3})
    image = w.input((2, 3, 8, 8), (3, 3, 8, 8))
    weight = w.param((12, 3, 4, 4), "patch.weight")
    out = w.op("conv2d", [image, weight], [(2, 12, 2, 2)], [(3, 12, 2, 2)])
    names = w.names()
    assert names[out][:2] == ("B", "C")
    assert "T" not in (names[image] or ())


def test_an_axis_no_rule_carries_and_only_a_size_matches_reads_unknown():
    """A computed axis of 4 (a patch count, say) beside a head width of 4 that nothing
    declares: the size alone proves nothing, so it is ``?``, not ``D``."""
    w = Walk(sizes={"B": 2, "C": 12, "H": 3}, moved={"B": 3})
    x = w.input((2, 3, 8, 8), (3, 3, 8, 8))
    pooled = w.op("adaptive_avg_pool2d", [x], [(2, 3, 2, 2)], [(3, 3, 2, 2)])
    flat = w.op("flatten", [pooled], [(2, 3, 4)], [(3, 3, 4)])
    names = w.names()
    assert names[flat][1:] == ("?", "?")


def test_each_named_axis_says_why():
    w = Walk()
    x = w.input((2, 5, 12), (3, 9, 12))
    weight = w.param((20, 12), "fc.weight")
    y = w.op("linear", [x, weight], [(2, 5, 20)], [(3, 9, 20)])
    letters = {k: Sized(v, f"config.{k}") for k, v in SIZES.items()}
    inputs = Pass("inputs", "device", {**SIZES, **MOVED}, w.other)
    named, table = name_axes(w.steps, w.tensors, Evidence(letters, inputs, param_paths=w.paths))
    assert named[x].why[:2] == ("input", "input")
    assert named[y].why == ("carried linear",) * 3
    assert proof_text("carried linear") == "carried by linear from its input's axis"
    assert table["T"]["moved_by"] == ["inputs"] and "moved_by" not in table["F"]


def test_einsum_takes_each_output_subscript_from_the_input_axis_of_that_subscript():
    w = Walk(sizes={**SIZES, "T": 4})  # T == D: only the equation can tell i, j from d
    x = w.input((2, 4, 12), (3, 9, 12))
    heads = w.op("view", [x], [(2, 4, 3, 4)], [(3, 9, 3, 4)])
    q = w.op("transpose", [heads], [(2, 3, 4, 4)], [(3, 3, 9, 4)], "q.transpose(1, 2)")
    text = 'sim = einsum("b h i d, b h j d -> b h i j", q, k)'  # einops' spaced spelling
    scores = w.op("einsum", [q, q], [(2, 3, 4, 4)], [(3, 3, 9, 9)], text)
    out = w.op(
        "einsum",
        [scores, q],
        [(2, 3, 4, 4)],
        [(3, 3, 9, 4)],
        "torch.einsum('bhij,bhjd->bhid', a, v)",
    )
    names = w.names()
    assert names[scores] == ("B", "H", "T", "T") and names[out] == ("B", "H", "T", "D")


def test_unsqueeze_and_squeeze_keep_the_order_of_the_axes_bigger_than_one():
    """``row.unsqueeze(-1)`` of ``(B, T, T)`` where the inputs pass could not pair the
    tensor: sizes alone would let the last T take either T's name; the order says which."""
    w = Walk()
    x = w.input((2, 5, 12), (3, 9, 12))
    y = w.op("unsqueeze", [x], [(2, 1, 5, 12)], [(3, 1, 9, 12)], text="x.unsqueeze(1)")
    z = w.op("squeeze", [y], [(2, 5, 12)], [None], text="y.squeeze(1)")
    names = w.names()
    assert names[y] == ("B", "1", "T", "C") and names[z] == ("B", "T", "C")


def test_a_recurrent_layer_names_its_weights_by_its_contract_and_carries_its_width():
    """An LSTM whose input is as wide as its hidden state (12 == C): the input weight's
    columns are ``input_size`` (no letter), whatever the size says; the hidden weight's are
    ``hidden_size`` (``C``) and its rows the 4 gates (``4C``); the output's width and the
    final state's are the hidden weight's columns, its steps and batch the input's."""
    w = Walk()
    x = w.input((2, 5, 12), (3, 9, 12))
    h0 = w.op("zeros", [], [(1, 2, 12)], [(1, 3, 12)], text="torch.zeros(1, b, hidden)")
    ih, hh = w.param((48, 12), "rnn.weight_ih_l0"), w.param((48, 12), "rnn.weight_hh_l0")
    gates, hidden = Contract("hidden_size", 12, 4), Contract("hidden_size", 12)
    w.contracts = {
        "rnn.weight_ih_l0": (gates, Contract("input_size", 12)),
        "rnn.weight_hh_l0": (gates, hidden),
    }
    out, h_n = w.op("lstm", [x, h0, ih, hh], [(2, 5, 12), (1, 2, 12)], [(3, 9, 12), (1, 3, 12)])
    names = w.names()
    assert names[ih] == ("4C", "?")
    assert names[hh] == ("4C", "C")
    assert names[out] == ("B", "T", "C")
    assert names[h_n][1:] == ("B", "C")
    w.contracts = {}  # without the contract: the same weight by its size alone
    assert w.names()[ih] != ("4C", "?")
