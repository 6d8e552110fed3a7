"""A hand-built ``Trace`` shaped like a tiny decoder, for the app tests.

It follows ``tracing/record.py`` only (the data contract), so the desktop app can be tested
without running the tracer: a root module, embeddings, ``n_layers`` Pre-LN blocks with
multi-head attention (``split_heads`` as view + transpose, attention weights kept), a
feed-forward network, the residual adds, a final norm and an LM head. Values are real
tensors with real stats; ``inf_at`` plants an Inf in one op's output.
"""

from __future__ import annotations

import torch

from tracing.record import ModuleInfo, SourceLocation, Step, TensorRecord, TensorStats, Trace

SOURCE_FILE = __file__


class _Recorder:
    """Records module entries/exits and ops the way the tracer does (indices, parents, ends)."""

    def __init__(self, *, capture_values: bool = True):
        self.steps: list[dict] = []
        self.tensors: list[TensorRecord] = []
        self.values: dict[str, torch.Tensor] = {}
        self.stack: list[int] = []
        self.capture_values = capture_values
        self.line = 10

    def tensor(self, value: torch.Tensor, dims, producer, role=None) -> int:
        tid = len(self.tensors)
        finite = value[torch.isfinite(value)] if value.is_floating_point() else value.float()
        stats = TensorStats(
            min=float(finite.min()) if finite.numel() else 0.0,
            max=float(finite.max()) if finite.numel() else 0.0,
            mean=float(finite.float().mean()) if finite.numel() else 0.0,
            std=float(finite.float().std()) if finite.numel() > 1 else 0.0,
            nan=int(torch.isnan(value).sum()) if value.is_floating_point() else 0,
            inf=int(torch.isinf(value).sum()) if value.is_floating_point() else 0,
        )
        key = None
        if self.capture_values:
            key = f"t{tid}"
            self.values[key] = value.detach().clone()
        self.tensors.append(
            TensorRecord(
                id=tid,
                shape=tuple(value.shape),
                dtype=str(value.dtype).removeprefix("torch."),
                dims=tuple(dims) if dims else None,
                stats=stats,
                value_key=key,
                producer=producer,
                role=role,
            )
        )
        return tid

    def _source(self, text: str) -> SourceLocation:
        self.line += 1
        return SourceLocation(file=SOURCE_FILE, line=self.line, text=text, function="forward")

    def enter(self, path: str, type_name: str, inputs: list[int], names=None) -> int:
        index = len(self.steps)
        self.steps.append(
            dict(
                index=index,
                kind="module",
                module=path,
                op=type_name,
                source=self._source(f"self.{path.rsplit('.', 1)[-1] or 'model'}(x)"),
                inputs=tuple(inputs),
                input_names=tuple(names or [f"args[{i}]" for i in range(len(inputs))]),
                depth=len(self.stack),
                parent=self.stack[-1] if self.stack else None,
            )
        )
        self.stack.append(index)
        return index

    def exit(self, outputs: list[int]) -> None:
        index = self.stack.pop()
        self.steps[index]["outputs"] = tuple(outputs)
        self.steps[index]["output_names"] = tuple(
            "output" if i == 0 else f"output[{i}]" for i in range(len(outputs))
        )
        self.steps[index]["end"] = len(self.steps) - 1

    def op(self, name: str, inputs: list[int], value: torch.Tensor, dims, role=None) -> int:
        index = len(self.steps)
        module = self.steps[self.stack[-1]]["module"]
        self.steps.append(
            dict(
                index=index,
                kind="op",
                module=module,
                op=name,
                source=self._source(f"{name}(...)"),
                inputs=tuple(inputs),
                input_names=tuple(f"args[{i}]" for i in range(len(inputs))),
                depth=len(self.stack),
                parent=self.stack[-1],
            )
        )
        out = self.tensor(value, dims, index, role)
        self.steps[index]["outputs"] = (out,)
        self.steps[index]["output_names"] = ("output",)
        return out

    def value(self, tid: int) -> torch.Tensor:
        return self.values[f"t{tid}"]


def tiny_trace(
    n_layers: int = 2,
    T: int = 6,
    C: int = 8,
    H: int = 2,
    V: int = 16,
    inf_at: str | None = None,
    capture_values: bool = True,
) -> Trace:
    """A trace of a tiny decoder; ``inf_at="blocks.1.ff.act"`` plants an Inf there."""
    D = C // H
    r = _Recorder(capture_values=True)
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g)

    # ---- module hierarchy
    modules: dict[str, ModuleInfo] = {}

    def add(path: str, type_name: str, children=(), params=0):
        parent = None if path == "" else (path.rsplit(".", 1)[0] if "." in path else "")
        modules[path] = ModuleInfo(path, type_name, parent, tuple(children), params, params)

    block_children = ["ln_1", "attn", "ln_2", "ff"]
    add("", "DecoderOnlyTransformer", ["tok_emb", "pos_emb", "blocks", "ln_f", "lm_head"])
    add("tok_emb", "Embedding", params=V * C)
    add("pos_emb", "LearnedPositionalEncoding", params=T * C)
    add("blocks", "ModuleList", [f"blocks.{i}" for i in range(n_layers)])
    for i in range(n_layers):
        b = f"blocks.{i}"
        add(b, "DecoderBlock", [f"{b}.{c}" for c in block_children])
        add(f"{b}.ln_1", "LayerNorm", params=2 * C)
        add(
            f"{b}.attn",
            "MultiHeadAttention",
            [f"{b}.attn.{c}" for c in ("W_q", "W_k", "W_v", "sdpa", "W_o")],
        )
        for c in ("W_q", "W_k", "W_v", "W_o"):
            add(f"{b}.attn.{c}", "Linear", params=C * C + C)
        add(f"{b}.attn.sdpa", "ScaledDotProductAttention")
        add(f"{b}.ln_2", "LayerNorm", params=2 * C)
        add(f"{b}.ff", "PositionWiseFeedForward", [f"{b}.ff.{c}" for c in ("fc1", "act", "fc2")])
        add(f"{b}.ff.fc1", "Linear", params=C * 4 * C + 4 * C)
        add(f"{b}.ff.act", "GELU")
        add(f"{b}.ff.fc2", "Linear", params=4 * C * C + C)
    add("ln_f", "LayerNorm", params=2 * C)
    add("lm_head", "Linear", params=C * V)

    # ---- the forward pass
    tokens = torch.randint(0, V, (1, T), generator=g)
    x_in = r.tensor(tokens, ("B", "T"), None, role="input")
    BTC = ("B", "T", "C")

    def linear(path, x, out_features, dims=BTC):
        r.enter(path, "Linear", [x], ["input"])
        y = r.op("linear", [x], rnd(1, T, out_features), dims)
        r.exit([y])
        return y

    r.enter("", "DecoderOnlyTransformer", [x_in], ["idx"])
    r.enter("tok_emb", "Embedding", [x_in], ["input"])
    tok = r.op("embedding", [x_in], rnd(1, T, C), BTC)
    r.exit([tok])
    pos_ids = r.op("arange", [], torch.arange(T).unsqueeze(0), ("B", "T"))
    r.enter("pos_emb", "LearnedPositionalEncoding", [pos_ids], ["positions"])
    pos = r.op("embedding", [pos_ids], rnd(1, T, C), BTC)
    r.exit([pos])
    x = r.op("add", [tok, pos], r.value(tok) + r.value(pos), BTC)
    for i in range(n_layers):
        b = f"blocks.{i}"
        r.enter(b, "DecoderBlock", [x], ["x"])
        r.enter(f"{b}.ln_1", "LayerNorm", [x], ["input"])
        h = r.op("layer_norm", [x], rnd(1, T, C), BTC)
        r.exit([h])
        r.enter(f"{b}.attn", "MultiHeadAttention", [h], ["x"])
        heads = []
        for c in ("W_q", "W_k", "W_v"):
            p = linear(f"{b}.attn.{c}", h, C)
            v = r.op("view", [p], rnd(1, T, H, D), ("B", "T", "H", "D"))
            heads.append(r.op("transpose", [v], rnd(1, H, T, D), ("B", "H", "T", "D")))
        q, k, v = heads
        r.enter(f"{b}.attn.sdpa", "ScaledDotProductAttention", [q, k, v], ["q", "k", "v"])
        kt = r.op("transpose", [k], rnd(1, H, D, T), ("B", "H", "D", "T"))
        scores = r.op("matmul", [q, kt], rnd(1, H, T, T), ("B", "H", "T", "T"))
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        masked = r.op(
            "masked_fill",
            [scores],
            r.value(scores).masked_fill(mask, float("-inf")),
            ("B", "H", "T", "T"),
        )
        weights = r.op(
            "softmax",
            [masked],
            torch.softmax(r.value(masked), -1),
            ("B", "H", "T", "T"),
            role="attention",
        )
        ctx = r.op("matmul", [weights, v], rnd(1, H, T, D), ("B", "H", "T", "D"))
        r.exit([ctx, weights])
        merged = r.op("transpose", [ctx], rnd(1, T, H, D), ("B", "T", "H", "D"))
        merged = r.op("view", [merged], rnd(1, T, C), BTC)
        a = linear(f"{b}.attn.W_o", merged, C)
        r.exit([a])
        x = r.op("add", [x, a], r.value(x) + r.value(a), BTC)  # residual
        r.enter(f"{b}.ln_2", "LayerNorm", [x], ["input"])
        h = r.op("layer_norm", [x], rnd(1, T, C), BTC)
        r.exit([h])
        r.enter(f"{b}.ff", "PositionWiseFeedForward", [h], ["x"])
        f = linear(f"{b}.ff.fc1", h, 4 * C, ("B", "T", "F"))
        r.enter(f"{b}.ff.act", "GELU", [f], ["input"])
        act = rnd(1, T, 4 * C)
        if inf_at == f"{b}.ff.act":
            act[0, 1, 2] = float("inf")
        f = r.op("gelu", [f], act, ("B", "T", "F"))
        r.exit([f])
        f = linear(f"{b}.ff.fc2", f, C)
        r.exit([f])
        x = r.op("add", [x, f], r.value(x) + r.value(f), BTC)  # residual
        r.exit([x])
    r.enter("ln_f", "LayerNorm", [x], ["input"])
    x = r.op("layer_norm", [x], rnd(1, T, C), BTC)
    r.exit([x])
    logits = linear("lm_head", x, V, ("B", "T", "V"))
    r.exit([logits])

    steps = [Step(**s) for s in r.steps]
    values = r.values if capture_values else {}
    tensors = r.tensors
    if not capture_values:
        tensors = [TensorRecord(**{**t.__dict__, "value_key": None}) for t in tensors]
    return Trace(
        steps=steps,
        modules=modules,
        tensors=tensors,
        meta={
            "model_class": "DecoderOnlyTransformer",
            "capture": "values" if capture_values else "stats",
            "prompt": "abcdef"[:T],
            "token_strings": list("abcdef"[:T]),
        },
        values=values,
    )


def window_on_live_model(qtbot, tmp_path, model, args: tuple):
    """A main window (its own settings file) showing a ``values`` trace of ``model(*args)``,
    the live model kept, as ``tracing.show`` opens it: edits re-run that object."""
    from PySide6.QtCore import QSettings

    from app.core import session
    from app.core.user_model import LoadedModel
    from app.windows.main_window import MainWindow

    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    w = MainWindow(settings=settings)
    qtbot.addWidget(w)
    source = session.ModelSource("live", live=LoadedModel(model, args=args))
    request = session.TraceRequest("", source, capture="values")
    w._pending_request = request
    w._on_trace_finished(session.run_trace(request))
    return w
