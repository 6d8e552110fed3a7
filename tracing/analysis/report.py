"""Shape reports of a trace: per module and per step, as Markdown, CSV, JSON, HTML, GraphML.

Computing a report is kept apart from formatting it (as torchinfo does): ``compute(trace)``
gathers plain rows — path, type, op, source line, input and output shapes with their
symbolic dims, dtype, parameters, stats — and each ``_render_<fmt>`` only lays those rows
out. So every format shows the same facts, and a new format is one small function.

>>> from tracing import report
>>> print(report.render(trace, "md"))          # doctest: +SKIP
>>> report.write(trace, "shapes.html")         # doctest: +SKIP   (format from the suffix)

Source paths are shortened so a report does not depend on the machine that made it: a
file under the current folder is shown relative to it, one inside an installed package
from its ``site-packages`` folder on, anything else as it was recorded. Steps are named by
their number, 1-based as the app's step bar counts (``tracing.formatting.step_number``), in
every format: the ``#`` column, the CSV's and JSON's ``step``.

``proofs=True`` (``scratchformer report --proofs``) adds why each axis has its name: a
``proofs`` column per module and step row (its outputs' axes, and those of its inputs that
no step made: the model's inputs, parameters and buffers), each axis's proof
(``TensorRecord.why`` in words, :func:`tracing.dim_legend.proof_text`; ``?=32 not proven``
for an unnamed axis; the axes one proof names together: ``[B, T] carried by linear from its
input's axis``), and in the Dims table the passes that moved each letter. JSON gives
every tensor cell its ``why`` codes and ``proofs`` words, one per axis.

>>> print(report.render(trace, "md", proofs=True))   # doctest: +SKIP
"""

from __future__ import annotations

import csv
import functools
import html
import io
import json
import math
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracing import collector, markdown
from tracing.analysis.compute import NOTE, compute_of
from tracing.dim_legend import NO_LETTERS, LegendRow, evidence_text, letter_legend, proof_text
from tracing.formatting import format_number, format_shape, step_number
from tracing.jsonable import to_jsonable
from tracing.record import Step, TensorRecord, Trace
from tracing.safe_text import csv_cell, inert_document, shown

NAME_CUT = 1000
"""Longest module path, type, op or tensor name a report shows (then a cut marker)."""

MAX_TOKEN_STRINGS = 256
"""Most prompt tokens a report spells out as their tokenizer's strings (then ``…``)."""

FORMATS: tuple[str, ...] = ("md", "csv", "json", "html", "graphml")
"""Report formats, by the name ``render`` and ``scratchformer report --format`` take."""

SUFFIXES = {
    ".md": "md",
    ".markdown": "md",
    ".csv": "csv",
    ".json": "json",
    ".html": "html",
    ".htm": "html",
    ".graphml": "graphml",
}

REPORT_SCHEMA = 2
"""Version of the JSON report layout. 2: a step row's ``step`` is the step number people
read (1-based, as the app counts) where 1 had ``index`` (0-based); ``first_step`` too."""


# --------------------------------------------------------------------------- the rows


@dataclass(frozen=True)
class TensorCell:
    """One input or output of a step, as a report shows it."""

    id: int
    name: str  # "x", "output", "args[0]"... ("" when the tracer gave none)
    shape: tuple[int, ...]
    dims: tuple[str, ...] | None
    dtype: str
    role: str | None
    why: tuple[str, ...] | None = None  # each axis's proof code (only in a report of proofs)

    @property
    def text(self) -> str:
        """``x: (B=1, T=3, C=4)``; with the dtype appended when it is not float32."""
        shape = format_shape(self.shape, self.dims)
        dtype = "" if self.dtype == "float32" else f" {self.dtype}"
        return f"{self.name}: {shape}{dtype}" if self.name else f"{shape}{dtype}"


@dataclass(frozen=True)
class StatsCell:
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    std: float | None = None
    nan: int | None = None
    inf: int | None = None


@dataclass(frozen=True)
class StepRow:
    """One step of the forward pass."""

    step: int  # its number, as people read it (1-based: ``tracing.formatting.step_number``)
    kind: str  # "module" or "op"
    depth: int
    module: str  # dotted path, "" for the root
    type: str  # the module's class name
    op: str
    source: str  # "file:line" ("" when unknown)
    code: str  # the source line's text
    inputs: tuple[TensorCell, ...]
    outputs: tuple[TensorCell, ...]
    dtype: str  # of the first output ("" when none)
    params: int | None  # module steps: parameters of the module's subtree
    stats: StatsCell  # of the first output
    error: str | None = None
    proven: tuple[TensorCell, ...] = ()  # whose proofs the row lists (a report of proofs)


@dataclass(frozen=True)
class ModuleRow:
    """One module of the model (whether it ran or not); shapes from its first call."""

    path: str
    type: str
    depth: int
    calls: int
    first_step: int | None  # the number of the step of its first call (1-based)
    params: int  # owned directly
    params_total: int  # whole subtree
    source: str
    code: str
    inputs: tuple[TensorCell, ...]
    outputs: tuple[TensorCell, ...]
    dtype: str
    stats: StatsCell
    extra: str
    mult_adds: int | None = None  # the subtree's, from torchinfo (trace.meta["compute"])
    proven: tuple[TensorCell, ...] = ()  # whose proofs the row lists (a report of proofs)


@dataclass
class Report:
    """Everything a report shows, computed once from a trace."""

    title: str
    summary: dict[str, Any]  # short facts shown at the top (model, capture, tokens...)
    meta: dict[str, Any]  # the trace's full meta, JSON-safe
    modules: list[ModuleRow] = field(default_factory=list)
    steps: list[StepRow] = field(default_factory=list)
    error: str | None = None
    letters: list[LegendRow] | None = None  # the trace's axis letters; None: sizes only
    named: bool = False  # some tensor has dims (so the letters, or their absence, are said)
    proofs: bool = False  # each axis's proof is listed (``compute(trace, proofs=True)``)
    evidence: str = ""  # a report of proofs: how the names were proven (the second pass)


# --------------------------------------------------------------------------- compute


def compute(trace: Trace, *, proofs: bool = False) -> Report:
    """Gather the report rows of ``trace`` (no formatting here); ``proofs``: with each
    axis's proof (see the module docstring)."""
    with collector.paused():  # rows by the hundred thousand, in no cycle: see collector
        return _compute(trace, proofs)


def _compute(trace: Trace, proofs: bool = False) -> Report:
    modules = trace.modules

    # the same names and source lines come back step after step: each made inert once
    names_shown: dict[str, str] = {}
    sources_shown: dict[Any, tuple[str, str]] = {}

    def name_shown(text: str) -> str:
        out = names_shown.get(text)
        if out is None:
            out = names_shown[text] = shown(text, NAME_CUT)
        return out

    def cells(ids: Sequence[int], names: Sequence[str]) -> tuple[TensorCell, ...]:
        out = []
        for i, tid in enumerate(ids):
            r = trace.tensors[tid]
            name = name_shown(names[i]) if i < len(names) else ""
            if proofs:
                out.append(TensorCell(tid, name, r.shape, r.dims, r.dtype, r.role, r.why))
            else:
                out.append(TensorCell(tid, name, r.shape, r.dims, r.dtype, r.role))
        return tuple(out)

    def proven(inputs: tuple[TensorCell, ...], outputs: tuple[TensorCell, ...]):
        """The outputs, and the inputs no step made (model inputs, parameters, buffers)."""
        if not proofs:
            return ()
        leaves = [c for c in inputs if trace.tensors[c.id].producer is None]
        return (*leaves, *outputs) if leaves else outputs

    steps: list[StepRow] = []
    for s in trace.steps:
        info = modules.get(s.module)
        mtype = name_shown(info.type) if info else ""
        outputs = cells(s.outputs, s.output_names)
        first = trace.tensors[s.outputs[0]] if s.outputs else None
        source_text = sources_shown.get(s.source)
        if source_text is None:
            source_text = sources_shown[s.source] = _source_text(s)
        source, code = source_text
        inputs = cells(s.inputs, s.input_names)
        steps.append(
            StepRow(
                step=step_number(s.index),
                kind=s.kind,
                depth=s.depth,
                module=name_shown(s.module),
                type=mtype,
                op=name_shown(s.op),
                source=source,
                code=code,
                inputs=inputs,
                outputs=outputs,
                dtype=first.dtype if first else "",
                params=(info.params_total if info else None) if s.kind == "module" else None,
                stats=_stats_cell(first),
                error=None if s.error is None else shown(s.error, NAME_CUT),
                proven=proven(inputs, outputs),
            )
        )

    calls: dict[str, list[Step]] = {}
    for s in trace.steps:
        if s.kind == "module":
            calls.setdefault(s.module, []).append(s)
    compute_by_path = compute_of(trace)
    module_rows = []
    for m in modules.values():
        ran = calls.get(m.path, [])
        first_call = steps[ran[0].index] if ran else None
        module_rows.append(
            ModuleRow(
                path=shown(m.path, NAME_CUT),
                type=shown(m.type, NAME_CUT),
                depth=m.depth,
                calls=len(ran),
                first_step=first_call.step if first_call else None,
                params=m.params,
                params_total=m.params_total,
                source=first_call.source if first_call else "",
                code=first_call.code if first_call else "",
                inputs=first_call.inputs if first_call else (),
                outputs=first_call.outputs if first_call else (),
                dtype=first_call.dtype if first_call else "",
                stats=first_call.stats if first_call else StatsCell(),
                extra=shown(m.extra, NAME_CUT),
                mult_adds=compute_by_path[m.path][0] if m.path in compute_by_path else None,
                proven=first_call.proven if first_call else (),
            )
        )

    meta = trace.meta
    model = shown(
        str(
            meta.get("model_class")
            or meta.get("model")
            or (modules[""].type if "" in modules else "model")
        ),
        NAME_CUT,
    )
    tokens = meta.get("tokens")
    n_tokens = _count_tokens(tokens)
    summary: dict[str, Any] = {
        "model": model,
        "capture": meta.get("capture", ""),
        "text": meta.get("text", ""),
        "tokens": n_tokens,
        "steps": len(trace.steps),
        "module_steps": sum(1 for s in trace.steps if s.kind == "module"),
        "op_steps": sum(1 for s in trace.steps if s.kind == "op"),
        "modules": len(modules),
        "tensors": len(trace.tensors),
        "kept_values": len({r.value_key for r in trace.tensors if r.value_key is not None}),
        "parameters": modules[""].params_total if "" in modules else None,
        "torch": meta.get("torch_version", meta.get("torch", "")),
    }
    from tracing.token_names import has_tokenizer, prompt_labels

    if has_tokenizer(meta):  # the model's own tokenizer: the prompt as it was split
        labels = prompt_labels(meta)
        if labels is not None:
            summary["token_strings"] = labels[:MAX_TOKEN_STRINGS]
    if "" in compute_by_path:  # torchinfo's total, when the trace kept it
        summary["mult_adds"] = compute_by_path[""][0]
    from tracing.analysis.phases import phases

    training = phases(trace)
    if training is not None:  # a training step: each phase, and where it went non-finite
        summary["phases"] = [
            {
                "phase": p.name,
                "steps": p.steps,
                "first_nonfinite": None
                if p.first_nonfinite is None
                else {
                    "step": step_number(p.first_nonfinite.step),
                    "label": p.first_nonfinite.label,
                    "reason": p.first_nonfinite.reason,
                    "source": p.first_nonfinite.source,
                },
            }
            for p in training
        ]
    error = None if trace.error is None else shown(trace.error, NAME_CUT)
    if error:
        summary["error"] = error
    return Report(
        title=f"Trace report: {model.rsplit('.', 1)[-1]}",
        summary=summary,
        meta=to_jsonable(meta),
        modules=module_rows,
        steps=steps,
        error=error,
        letters=letter_legend(meta),
        named=any(r.dims for r in trace.tensors),
        proofs=proofs,
        evidence=shown(evidence_text(meta), NAME_CUT) if proofs else "",
    )


def _count_tokens(tokens: Any) -> int | None:
    if tokens is None:
        return None
    if isinstance(tokens, (list, tuple)):
        if tokens and all(isinstance(t, (list, tuple)) for t in tokens):  # a batch
            return sum(len(t) for t in tokens)
        return len(tokens)
    return None


def _source_text(step: Step) -> tuple[str, str]:
    src = step.source
    if src is None:
        return "", ""
    return f"{shown(short_path(src.file))}:{src.line}", shown(src.text)


def short_path(file: str) -> str:
    """A source path that does not depend on the machine (see the module docstring)."""
    if not file or file.startswith("<"):
        return file
    norm = file.replace("\\", "/")
    marker = "site-packages/"
    if marker in norm:
        return norm.rsplit(marker, 1)[1]
    try:
        rel = os.path.relpath(file)
    except ValueError:  # another drive on Windows
        return norm
    if not rel.startswith(".."):
        return rel.replace("\\", "/")
    return norm


_NO_STATS = StatsCell()  # one, shared by every row without stats (a 100,000-step trace's)


def _stats_cell(r: TensorRecord | None) -> StatsCell:
    if r is None or r.stats is None:
        return _NO_STATS
    s = r.stats
    return StatsCell(_finite(s.min), _finite(s.max), _finite(s.mean), _finite(s.std), s.nan, s.inf)


def _finite(x: float) -> float | None:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


# --------------------------------------------------------------------------- render


def render(trace: Trace | Report, fmt: str, *, proofs: bool = False) -> str:
    """The report of ``trace`` in format ``fmt`` (one of ``FORMATS``) as text; ``proofs``:
    with each axis's proof and the passes that moved each letter (module docstring)."""
    return "".join(render_chunks(trace, fmt, proofs=proofs))


def render_chunks(trace: Trace | Report, fmt: str, *, proofs: bool = False) -> Iterator[str]:
    """:func:`render` in pieces, to write as they come: a report is made a thousand rows
    at a time, so its text is never whole in memory (GraphML excepted). A computed
    :class:`Report` shows proofs when it was computed with them."""
    fmt = fmt.lower().lstrip(".")
    fmt = SUFFIXES.get("." + fmt, fmt)
    if fmt not in FORMATS:
        raise ValueError(f"unknown report format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if isinstance(trace, Report) and proofs and not trace.proofs:
        raise ValueError("this Report was computed without proofs: compute(trace, proofs=True)")
    if fmt == "graphml":
        if isinstance(trace, Report):
            raise ValueError("a GraphML report needs the trace itself, not a computed Report")
        return iter((inert_document(_encodable(_render_graphml(trace, proofs))),))
    report = trace if isinstance(trace, Report) else compute(trace, proofs=proofs)
    # text from the file is cut and escaped in compute; what is left (meta) escaped here
    if fmt == "json":
        return (inert_document(_encodable(c), json=True) for c in _json_chunks(report))
    chunks = {"md": _md_chunks, "csv": _csv_chunks}.get(fmt, _html_chunks)
    return (inert_document(_encodable(c)) for c in chunks(report))


ROWS_PER_CHUNK = 1000
"""Rows rendered into one piece of :func:`render_chunks`."""


def _lines(lines: Iterable[str]) -> str:
    """Lines as text, each ended by a newline (a whole document: ``"\n".join`` + ``"\n"``)."""
    return "".join(line + "\n" for line in lines)


def _batches(rows: Sequence[Any]) -> Iterator[Sequence[Any]]:
    for start in range(0, len(rows), ROWS_PER_CHUNK):
        yield rows[start : start + ROWS_PER_CHUNK]


def _encodable(text: str) -> str:
    """``text`` with anything UTF-8 cannot encode (lone surrogates from a file's JSON
    escapes) replaced by ``?``, so every report can be written and printed."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def format_for(path: str | os.PathLike) -> str:
    """The report format a file name asks for, from its suffix."""
    suffix = Path(path).suffix.lower()
    fmt = SUFFIXES.get(suffix)
    if fmt is None:
        raise ValueError(
            f"cannot tell the report format from {str(path)!r}; use a suffix "
            f"({', '.join(sorted(SUFFIXES))}) or give the format"
        )
    return fmt


def write(
    trace: Trace | Report,
    path: str | os.PathLike,
    fmt: str | None = None,
    *,
    proofs: bool = False,
) -> Path:
    """Write the report to ``path``; the format comes from the suffix unless given;
    ``proofs`` as for :func:`render`."""
    path = Path(path)
    chunks = render_chunks(trace, fmt or format_for(path), proofs=proofs)
    write_text(path, chunks)
    return path


def write_text(path: str | os.PathLike, text: str | Iterable[str]) -> Path:
    """Write ``text`` (or its pieces, as they come) as UTF-8 under a temporary name
    beside ``path``, then rename it over ``path``: a failed write leaves no empty or
    half-written report behind."""
    path = Path(path)
    chunks = (text,) if isinstance(text, str) else text
    if os.path.lexists(path) and not path.is_file() and not path.is_dir():
        # a device or a FIFO (/dev/null, a pipe): write into it; renaming over it would
        # replace it with a plain file
        with open(path, "w", encoding="utf-8", newline="") as f:
            for chunk in chunks:
                f.write(_encodable(chunk))
        return path
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:100]}.", suffix=".partial")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            for chunk in chunks:
                f.write(_encodable(chunk))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# ---- shared cell text


def _num(x: float | int | None) -> str:
    return format_number(x, missing="")


def _cells_text(cells: Sequence[TensorCell]) -> str:
    return "; ".join(c.text for c in cells)


def _params_text(n: int | None) -> str:
    return "" if n is None else f"{n:,}"


PROOFS_NOTE = (
    "Each row's proofs say why each axis of its outputs (and of the inputs no step made) "
    "has its name; `?` axes are not proven."
)
"""Said under the Dims table of a report of proofs."""

NOT_PROVEN = "not proven"
"""What a report of proofs says of an unnamed (``?``) axis: no evidence named it."""

NO_PROOF = "no proof recorded"
"""What it says of a named axis whose file kept no proof (one saved before proofs)."""


def axis_proofs(
    shape: Sequence[int], dims: Sequence[str] | None, why: Sequence[str] | None
) -> tuple[str, ...]:
    """Each axis's proof in words: :func:`tracing.dim_legend.proof_text` of its
    ``TensorRecord.why`` code, :data:`NOT_PROVEN` for a ``?`` axis (or every axis of a
    tensor without names), :data:`NO_PROOF` for a named axis with no code."""
    return _axis_proofs(
        tuple(shape),
        None if dims is None else tuple(dims),
        None if why is None else tuple(why),
    )


@functools.lru_cache(maxsize=4096)
def _axis_proofs(
    shape: tuple[int, ...], dims: tuple[str, ...] | None, why: tuple[str, ...] | None
) -> tuple[str, ...]:
    named = dims is not None and len(dims) == len(shape)
    kept = why is not None and len(why) == len(shape)
    out = []
    for i in range(len(shape)):
        if not named or dims[i] in ("", "?"):
            out.append(NOT_PROVEN)
        elif kept and why[i]:
            out.append(shown(proof_text(why[i]), NAME_CUT))
        else:
            out.append(NO_PROOF)
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _proofs_body(
    shape: tuple[int, ...], dims: tuple[str, ...] | None, why: tuple[str, ...] | None
) -> str:
    """``[B, T] carried by linear from its input's axis · [?=32] not proven``: the axes
    that share a proof together, in the order each proof first comes."""
    named = dims is not None and len(dims) == len(shape)
    groups: dict[str, list[str]] = {}
    for i, text in enumerate(_axis_proofs(shape, dims, why)):
        name = dims[i] if named and dims[i] not in ("", "?") else f"?={shape[i]}"
        groups.setdefault(text, []).append(name)
    return " · ".join(f"[{', '.join(names)}] {text}" for text, names in groups.items())


def _cell_proofs(c: TensorCell) -> str:
    """One tensor's proofs: ``output: [B, T] carried by linear…``; "" for a scalar."""
    if not c.shape:
        return ""
    body = _proofs_body(c.shape, c.dims, c.why)
    return f"{c.name}: {body}" if c.name else body


def _proofs_cells(cells: Sequence[TensorCell]) -> list[str]:
    return [t for t in map(_cell_proofs, cells) if t]


def _proofs_text(cells: Sequence[TensorCell]) -> str:
    """A row's proofs column: its tensors' proofs, ``; `` between tensors."""
    return "; ".join(_proofs_cells(cells))


def _moved_text(r: LegendRow) -> str:
    """The passes that moved a letter: ``inputs, config.d_ff``; "" when none did."""
    return ", ".join(r.moved_by)


def _summary_lines(report: Report) -> list[tuple[str, str]]:
    s = report.summary
    lines = [("model", str(s["model"]))]
    if s.get("capture"):
        lines.append(("capture", str(s["capture"])))
    if s.get("parameters") is not None:
        lines.append(("parameters", f"{s['parameters']:,}"))
    if s.get("mult_adds") is not None:
        lines.append(("mult-adds", f"{s['mult_adds']:,} ({NOTE})"))
    if s.get("tokens") is not None:
        lines.append(("tokens", str(s["tokens"])))
    if s.get("token_strings"):
        more = s["tokens"] is not None and s["tokens"] > len(s["token_strings"])
        lines.append(("token strings", " ".join(s["token_strings"]) + (" …" if more else "")))
    if s.get("text"):
        lines.append(("text", repr(s["text"])))
    lines.append(
        (
            "steps",
            f"{s['steps']} ({s['module_steps']} module calls, {s['op_steps']} ops"
            + (f", {s['phases'][2]['steps']} backward)" if s.get("phases") else ")"),
        )
    )
    for p in s.get("phases", ()):
        lines.append((f"{p['phase']} steps", str(p["steps"])))
        hit = p["first_nonfinite"]
        if hit is not None:
            where = f" — {hit['source']}" if hit["source"] else ""
            earlier = next((q for q in s["phases"] if q["first_nonfinite"]), p)
            if earlier is not p:  # the forward (or the loss) was already non-finite
                where += (
                    f" (follows from the {earlier['phase']}'s, step"
                    f" {earlier['first_nonfinite']['step']})"
                )
            lines.append(
                (
                    f"{p['phase']}: first non-finite",
                    f"step {hit['step']} {hit['label']}: {hit['reason']}{where}",
                )
            )
    lines.append(("tensors", f"{s['tensors']} ({s['kept_values']} values kept)"))
    if s.get("torch"):
        lines.append(("torch", str(s["torch"])))
    if s.get("error"):
        lines.append(("error", str(s["error"])))
    return lines


# ---- Markdown


def _md_chunks(report: Report) -> Iterator[str]:
    lines = [f"# {markdown.escape(report.title)}", ""]
    lines += [f"- **{k}**: {markdown.escape(v)}" for k, v in _summary_lines(report)]
    proofs = report.proofs
    if report.letters:
        lines += ["", "## Dims", ""]
        rows = [
            [markdown.code(r.letter), _num(r.size), markdown.escape(r.origin),
             markdown.escape(r.meaning), *([markdown.escape(_moved_text(r))] if proofs else [])]
            for r in report.letters
        ]  # fmt: skip
        head = ("letter", "size", "origin", "meaning", *(["moved by"] if proofs else []))
        lines += markdown.table(head, rows)
    elif report.named:
        lines += ["", "## Dims", "", markdown.escape(NO_LETTERS[0].upper() + NO_LETTERS[1:])]
    if proofs and (report.letters or report.named):
        lines += ["", *([markdown.escape(report.evidence), ""] if report.evidence else [])]
        lines.append(PROOFS_NOTE)
    lines += ["", "## Modules", ""]
    rows = []
    macs = any(m.mult_adds is not None for m in report.modules)  # a column only when known
    for m in report.modules:
        indent = "&nbsp;&nbsp;" * m.depth
        rows.append(
            [
                indent + markdown.code(m.path or "<root>"),
                markdown.escape(m.type),
                str(m.calls),
                markdown.escape(_cells_text(m.inputs)),
                markdown.escape(_cells_text(m.outputs)),
                _params_text(m.params_total),
                *([_params_text(m.mult_adds)] if macs else []),
                markdown.escape(m.source),
                *([markdown.escape(_proofs_text(m.proven))] if proofs else []),
            ]
        )
    head = ("module", "type", "calls", "input shapes", "output shapes", "params")
    head += (*(["mult-adds"] if macs else []), "source", *(["proofs"] if proofs else []))
    lines += markdown.table(head, rows)
    lines += ["", "## Steps", ""]
    head = (
        "#", "module", "op", "inputs", "outputs", "dtype", "min", "max", "mean", "std",
        "nan/inf", "source", "code",
    )  # fmt: skip
    lines += markdown.table((*head, "proofs") if proofs else head, ())
    yield _lines(lines)
    for batch in _batches(report.steps):
        if proofs:
            yield _lines(
                markdown.row([*_md_step(s), markdown.escape(_proofs_text(s.proven))]) for s in batch
            )
        else:
            yield _lines(markdown.row(_md_step(s)) for s in batch)
    if report.error:
        yield _lines(["", f"**The forward pass raised:** {markdown.escape(report.error)}"])


def _md_step(s: StepRow) -> list[str]:
    op = f"**{markdown.escape(s.op)}**" if s.kind == "module" else markdown.escape(s.op)
    if s.error:
        op += " ⚠"
    return [
        str(s.step),
        markdown.code(s.module or "<root>"),
        op,
        markdown.escape(_cells_text(s.inputs)),
        markdown.escape(_cells_text(s.outputs)),
        markdown.escape(s.dtype),
        _num(s.stats.min),
        _num(s.stats.max),
        _num(s.stats.mean),
        _num(s.stats.std),
        _nonfinite_text(s.stats),
        markdown.escape(s.source),
        markdown.code(s.code),
    ]


def _nonfinite_text(stats: StatsCell) -> str:
    if stats.nan is None and stats.inf is None:
        return ""
    return f"{stats.nan or 0}/{stats.inf or 0}"


# ---- CSV

CSV_COLUMNS = (
    "row",
    "step",
    "kind",
    "depth",
    "module",
    "type",
    "op",
    "calls",
    "inputs",
    "outputs",
    "dtype",
    "params",
    "params_total",
    "min",
    "max",
    "mean",
    "std",
    "nan",
    "inf",
    "source",
    "code",
    "error",
)
"""One table for both views: ``row`` is ``module`` (one per module) or ``step``."""

CSV_PROOF_COLUMNS = ("proofs", "letter", "size", "origin", "meaning", "moved_by")
"""Added after :data:`CSV_COLUMNS` in a report of proofs: a module's or step's ``proofs``,
and first a ``row`` ``letter`` per letter of the trace (its size, origin, meaning and the
passes that moved it, ``;`` between them)."""


def _csv_chunks(report: Report) -> Iterator[str]:
    buf = io.StringIO()
    w = _SafeCsvWriter(csv.writer(buf, lineterminator="\n"))
    proofs = report.proofs
    w.writerow((*CSV_COLUMNS, *CSV_PROOF_COLUMNS) if proofs else CSV_COLUMNS)
    if proofs:
        blank = [""] * len(CSV_COLUMNS)
        for r in report.letters or ():
            size = "" if r.size is None else r.size
            w.writerow(["letter", *blank[1:], "", r.letter, size, r.origin, r.meaning,
                        "; ".join(r.moved_by)])  # fmt: skip

    def written() -> str:
        """What was written since the last call (and the buffer emptied)."""
        text = buf.getvalue()
        buf.seek(0)
        buf.truncate()
        return text

    def stats(st: StatsCell) -> list[str]:
        return [
            _csv_num(st.min),
            _csv_num(st.max),
            _csv_num(st.mean),
            _csv_num(st.std),
            "" if st.nan is None else str(st.nan),
            "" if st.inf is None else str(st.inf),
        ]

    for m in report.modules:
        w.writerow(
            [
                "module",
                "" if m.first_step is None else m.first_step,
                "module",
                m.depth,
                m.path,
                m.type,
                "",
                m.calls,
                _cells_text(m.inputs),
                _cells_text(m.outputs),
                m.dtype,
                m.params,
                m.params_total,
                *stats(m.stats),
                m.source,
                m.code,
                "",
                *([_proofs_text(m.proven)] if proofs else []),
            ]
        )
    yield written()
    for i, s in enumerate(report.steps, 1):
        w.writerow(
            [
                "step",
                s.step,
                s.kind,
                s.depth,
                s.module,
                s.type,
                s.op,
                "",
                _cells_text(s.inputs),
                _cells_text(s.outputs),
                s.dtype,
                "",
                "" if s.params is None else s.params,
                *stats(s.stats),
                s.source,
                s.code,
                s.error or "",
                *([_proofs_text(s.proven)] if proofs else []),
            ]
        )
        if i % ROWS_PER_CHUNK == 0:
            yield written()
    yield written()


class _SafeCsvWriter:
    """A csv writer whose cells a spreadsheet will not evaluate (``safe_text.csv_cell``)."""

    def __init__(self, writer: Any) -> None:
        self._writer = writer

    def writerow(self, row: Sequence[Any]) -> None:
        self._writer.writerow([csv_cell(c) for c in row])


def _csv_num(x: float | None) -> str:
    return "" if x is None else repr(float(x))


# ---- JSON


def _cell_json(c: TensorCell) -> dict[str, Any]:
    return {
        "id": c.id,
        "name": c.name,
        "shape": c.shape,  # a tuple: ``json`` writes it as the list it is
        "dims": c.dims,
        "dtype": c.dtype,
        "role": c.role,
        "text": c.text,
    }


def _proven_cell_json(c: TensorCell) -> dict[str, Any]:
    """A cell of a report of proofs: with each axis's proof code and its words."""
    d = _cell_json(c)
    d["why"] = c.why
    d["proofs"] = axis_proofs(c.shape, c.dims, c.why)
    return d


def _row_json(r: StepRow | ModuleRow, proofs: bool = False) -> dict[str, Any]:
    d = dict(r.__dict__)  # the fields in order (``asdict`` deep-copies: 8x slower)
    del d["proven"]  # a report of proofs gives each cell its proofs instead
    cell = _proven_cell_json if proofs else _cell_json
    d["inputs"] = [cell(c) for c in r.inputs]
    d["outputs"] = [cell(c) for c in r.outputs]
    d["stats"] = r.stats.__dict__  # only read (by the encoder)
    if d.get("mult_adds", 0) is None:
        del d["mult_adds"]  # only a trace that kept torchinfo's figures has them
    return d


def _json_chunks(report: Report) -> Iterator[str]:
    """The JSON report in pieces: the head as an indented object, then one module or step
    per line (so the document is never whole in memory, and a step is one ``grep`` line)."""
    head = {
        "format": "scratchformer-report",
        "schema": REPORT_SCHEMA,
        "title": report.title,
        "summary": to_jsonable(report.summary),
        "meta": report.meta,
        "error": report.error,
        "letters": None  # the letter table (also in meta["dim_letters"]); null: sizes only
        if report.letters is None
        else [
            {"letter": r.letter, "size": r.size, "origin": r.origin, "meaning": r.meaning}
            | ({"moved_by": r.moved_by} if report.proofs else {})
            for r in report.letters
        ],
    }
    if report.proofs:  # every cell has its "why" codes and "proofs" words, one per axis
        head["proofs"] = True
        head["evidence"] = report.evidence
    text = json.dumps(head, indent=1, ensure_ascii=False, allow_nan=False)
    yield text[:-2]  # without the closing "\n}"
    # rows made here hold no cycles: the encoder need not track every container it meets
    dumps = json.JSONEncoder(ensure_ascii=False, allow_nan=False, check_circular=False).encode
    for key, rows in (("modules", report.modules), ("steps", report.steps)):
        yield f',\n "{key}": ['
        batch: list[str] = []
        for i, r in enumerate(rows):
            batch.append(("\n  " if i == 0 else ",\n  ") + dumps(_row_json(r, report.proofs)))
            if len(batch) >= 1000:
                yield "".join(batch)
                batch = []
        yield "".join(batch) + ("\n ]" if rows else "]")
    yield "\n}\n"


def _render_json(report: Report) -> str:
    return "".join(_json_chunks(report))


# ---- HTML

_CSS = """
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em;
       color: #1d2330; background: #fbfbfd; }
h1 { font-size: 1.5em; margin-bottom: .2em; } h2 { margin-top: 1.6em; font-size: 1.2em; }
dl.summary { display: grid; grid-template-columns: max-content auto; gap: .2em 1em; }
dl.summary dt { font-weight: 600; color: #555; } dl.summary dd { margin: 0; }
table { border-collapse: collapse; font-size: 12.5px; width: 100%; }
th, td { border-bottom: 1px solid #e3e5ec; padding: 3px 8px; text-align: left;
         vertical-align: top; }
th { position: sticky; top: 0; background: #eef0f6; }
tr.module td { background: #f3f6ff; font-weight: 600; }
tr.error td { background: #ffecec; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code, .shape { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
.shape { white-space: nowrap; } .muted { color: #8a8f9c; }
.bad { color: #c0392b; font-weight: 600; }
.role { font-size: 11px; background: #ffe9b3; border-radius: 3px; padding: 0 4px; }
.error-banner { background: #ffecec; border: 1px solid #e6a1a1; padding: .6em 1em; }
"""


def _h(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _html_cells(cells: Sequence[TensorCell]) -> str:
    parts = []
    for c in cells:
        role = f' <span class="role">{_h(c.role)}</span>' if c.role == "attention" else ""
        parts.append(f'<span class="shape">{_h(c.text)}</span>{role}')
    return "<br>".join(parts)


def _html_chunks(report: Report) -> Iterator[str]:
    out = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f"<title>{_h(report.title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        f"<h1>{_h(report.title)}</h1>",
    ]
    if report.error:
        out.append(
            f'<p class="error-banner">The forward pass raised: <code>{_h(report.error)}</code>'
            " — the steps below end at the failing one.</p>"
        )
    out.append('<dl class="summary">')
    out += [f"<dt>{_h(k)}</dt><dd>{_h(v)}</dd>" for k, v in _summary_lines(report)]
    out.append("</dl>")
    proofs = report.proofs
    if report.letters:
        out += [
            "<h2>Dims</h2>",
            "<table>",
            "<thead><tr><th>letter</th><th>size</th><th>origin</th><th>meaning</th>"
            + ("<th>moved by</th>" if proofs else "")
            + "</tr></thead>",
            "<tbody>",
        ]
        out += [
            f"<tr><td><code>{_h(r.letter)}</code></td><td class=num>{_num(r.size)}</td>"
            f"<td>{_h(r.origin)}</td><td>{_h(r.meaning)}</td>"
            + (f"<td>{_h(_moved_text(r))}</td>" if proofs else "")
            + "</tr>"
            for r in report.letters
        ]
        out += ["</tbody>", "</table>"]
    elif report.named:
        out += ["<h2>Dims</h2>", f"<p>{_h(NO_LETTERS[0].upper() + NO_LETTERS[1:])}.</p>"]
    if proofs and (report.letters or report.named):
        out += [f"<p>{_h(report.evidence)}</p>"] if report.evidence else []
        out.append(f"<p>{_h(PROOFS_NOTE).replace('`?`', '<code>?</code>')}</p>")

    out += [
        "<h2>Modules</h2>",
        "<table>",
        "<thead><tr><th>module</th><th>type</th><th>calls</th><th>input shapes</th>"
        "<th>output shapes</th><th>params</th><th>own params</th>"
        + ("<th>mult-adds</th>" if any(m.mult_adds is not None for m in report.modules) else "")
        + "<th>source</th>"
        + ("<th>proofs</th>" if proofs else "")
        + "</tr></thead>",
        "<tbody>",
    ]
    macs = any(m.mult_adds is not None for m in report.modules)
    for m in report.modules:
        pad = f' style="padding-left:{0.5 + 1.2 * m.depth:.1f}em"'
        muted = "" if m.calls else ' class="muted"'
        out.append(
            f"<tr{muted}><td{pad}><code>{_h(m.path or '<root>')}</code></td>"
            f"<td>{_h(m.type)}</td><td class=num>{m.calls}</td>"
            f"<td>{_html_cells(m.inputs)}</td><td>{_html_cells(m.outputs)}</td>"
            f"<td class=num>{m.params_total:,}</td><td class=num>{m.params:,}</td>"
            + (f"<td class=num>{_params_text(m.mult_adds)}</td>" if macs else "")
            + f'<td title="{_h(m.code)}"><code>{_h(m.source)}</code></td>'
            + (f"<td>{_html_proofs(m.proven)}</td>" if proofs else "")
            + "</tr>"
        )
    out += ["</tbody>", "</table>"]

    out += [
        "<h2>Steps</h2>",
        "<table>",
        "<thead><tr><th>#</th><th>module</th><th>op</th><th>inputs</th><th>outputs</th>"
        "<th>dtype</th><th>min</th><th>max</th><th>mean</th><th>std</th><th>nan</th>"
        "<th>inf</th><th>source</th><th>code</th>"
        + ("<th>proofs</th>" if proofs else "")
        + "</tr></thead>",
        "<tbody>",
    ]
    yield _lines(out)
    for batch in _batches(report.steps):
        if proofs:
            yield _lines(_html_step(s, f"<td>{_html_proofs(s.proven)}</td>") for s in batch)
        else:
            yield _lines(map(_html_step, batch))
    yield _lines(["</tbody>", "</table>", "</body>", "</html>"])


def _html_proofs(cells: Sequence[TensorCell]) -> str:
    return "<br>".join(map(_h, _proofs_cells(cells)))


def _html_step(s: StepRow, more: str = "") -> str:
    classes = [s.kind] + (["error"] if s.error else [])
    pad = f' style="padding-left:{0.5 + 1.2 * s.depth:.1f}em"'
    nan = _num(s.stats.nan)
    inf = _num(s.stats.inf)
    nan_html = f'<span class="bad">{nan}</span>' if s.stats.nan else nan
    inf_html = f'<span class="bad">{inf}</span>' if s.stats.inf else inf
    title = f' title="{_h(s.error)}"' if s.error else ""
    return (
        f'<tr class="{" ".join(classes)}"{title}><td class=num>{s.step}</td>'
        f"<td><code>{_h(s.module or '<root>')}</code></td>"
        f"<td{pad}>{_h(s.op)}</td>"
        f"<td>{_html_cells(s.inputs)}</td><td>{_html_cells(s.outputs)}</td>"
        f"<td>{_h(s.dtype)}</td>"
        f"<td class=num>{_num(s.stats.min)}</td><td class=num>{_num(s.stats.max)}</td>"
        f"<td class=num>{_num(s.stats.mean)}</td><td class=num>{_num(s.stats.std)}</td>"
        f"<td class=num>{nan_html}</td><td class=num>{inf_html}</td>"
        f"<td><code>{_h(s.source)}</code></td><td><code>{_h(s.code)}</code></td>{more}</tr>"
    )


# ---- GraphML


def _render_graphml(trace: Trace, proofs: bool = False) -> str:
    """The trace graph as GraphML, by ``tracing.graph.to_graphml`` when it is there;
    ``proofs``: each step node with a ``proofs`` attribute (the Markdown column's text)."""
    extra = None
    if proofs:
        rows = compute(trace, proofs=True).steps
        extra = {s.index: {"proofs": _proofs_text(rows[s.index].proven)} for s in trace.steps}
    try:
        from tracing.analysis.graph import to_graphml
    except ImportError:
        return _graphml_fallback(trace, extra)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.graphml"
        to_graphml(trace, path, node_attrs=extra)
        return path.read_text(encoding="utf-8")


def _graphml_fallback(trace: Trace, extra: dict[int, dict[str, str]] | None = None) -> str:
    """A node per step and producer -> consumer edges, built here from the steps."""
    import networkx as nx

    g = nx.DiGraph()
    for s in trace.steps:
        out = [trace.tensors[t] for t in s.outputs]
        source, code = _source_text(s)
        g.add_node(
            s.index,
            kind=s.kind,
            module=s.module,
            op=s.op,
            depth=s.depth,
            parent=-1 if s.parent is None else s.parent,
            source=source,
            code=code,
            shapes="; ".join(r.shape_str() for r in out),
            label=s.label,
            **(extra or {}).get(s.index, {}),
        )
    for s in trace.steps:
        for t in s.inputs:
            producer = trace.tensors[t].producer
            if producer is not None and producer != s.index and producer in g:
                r = trace.tensors[t]
                g.add_edge(producer, s.index, tensor=t, shape=r.shape_str())
    return "\n".join(nx.generate_graphml(g)) + "\n"
