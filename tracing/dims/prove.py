"""The dims stage as the tracer runs it: gather the evidence, name every axis, say why.

:func:`name_trace` is the one entry: a finished trace, a trace whose forward raised, and a
streamed file's journal checkpoint are all named by it (the journal at ``"ops"``: no pass
while the capture is still running). The tracer hands in ``shapes_pass``, its own
shapes-only run, so this stage never imports the tracer.

Which passes run, by ``naming`` (:data:`tracing.capture.options.NAMING_LEVELS`):

- ``"full"``: the inputs pass, then, for a model that can be rebuilt, one pass per config
  knob that gives a letter its size, for real when the model is small, else on ``meta``,
  and one per config size no letter spells that an unnamed axis has (``hc_count``: the
  axes it alone moves are named after it);
- ``"proven"`` (the default): the same, but only for the knobs behind names that still tie
  (two names that give an axis's sizes in every pass so far). A letter no pass moved is
  named only where its config, a module attribute or the source declares it and no other
  name has its size;
- ``"inputs"``: the inputs pass only;
- ``"ops"``: no pass: what the ops carry from the first input, the config, declarations;
- ``"off"``: nothing named.

A model traced again the same way reuses its names (cached per model): the evidence and
the names depend on nothing else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import warnings
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from tracing.dims import passes as passes_mod
from tracing.dims.align import aligned_shapes, fill_repeats, step_kind
from tracing.dims.contracts import layer_contracts
from tracing.dims.evidence import Evidence, Pass, Subject
from tracing.dims.letters import (
    INPUT_LETTERS,
    LETTERS,
    Sized,
    attribute_letters,
    house_sizes,
    letter_sizes,
    letters_in,
    text_config,
)
from tracing.dims.naming import Table, name_axes
from tracing.dims.source import sizes_from_comments, sizes_from_source
from tracing.record import Step, TensorRecord, built

MAX_KNOB_PASSES = 10
"""At most this many knob passes per trace (each a rebuild and a run): the knobs behind
names that tie first, then the rest in the order of the letters."""


def name_trace(
    subject: Subject,
    steps: Sequence[Step],
    tensors: list[TensorRecord],
    meta: dict,
    shapes_pass: passes_mod.ShapesPass,
    naming: str = "proven",
) -> list[TensorRecord]:
    """The records named, and ``meta`` given ``dims`` (every letter's size: the one size
    table), ``dim_letters`` (the letters the names use, each with its origin and the passes
    that moved it) and ``dims_evidence`` (which passes ran, and what they cost)."""
    if passes_mod.in_pass() or not tensors:
        return tensors
    started = time.perf_counter()
    if naming == "off":
        meta["dims_evidence"] = {"naming": "off", "seconds": 0.0}
        return tensors
    key = _memo_key(steps, tensors, subject, naming)
    memo = _MEMO.get(subject.model)
    if memo is not None and memo[0] == key:  # the same run again: the same evidence
        names, filled = memo[1]
        for k, v in filled.items():
            meta[k] = dict(v) if isinstance(v, dict) else list(v)
        meta["dims_evidence"] = dict(meta["dims_evidence"], reused=True)
        return [_with_dims(r, n, w) for (n, w), r in zip(names, tensors)]
    try:
        evidence = gather(subject, steps, tensors, shapes_pass, naming)
        named, dim_letters = name_axes(steps, tensors, evidence)
    except Exception as exc:  # a fault in naming never costs the user the trace itself
        if os.environ.get("SCRATCHFORMER_DIMS_STRICT"):
            raise
        problem = f"axis names not computed: {type(exc).__name__}: {exc}"
        warnings.warn(problem, RuntimeWarning, stacklevel=2)
        meta.setdefault("notes", []).append(problem)
        meta["dims_evidence"] = {"naming": naming, "error": problem}
        return tensors
    meta["dims"] = {k: v.size for k, v in evidence.letters.items()}
    meta["dims"].update({k: v["size"] for k, v in dim_letters.items()})  # B, T put right
    meta["dim_letters"] = dim_letters  # with the letters naming found (Tk: attended keys)
    meta["dims_evidence"] = dict(evidence.info, seconds=round(time.perf_counter() - started, 6))
    filled = {k: meta[k] for k in ("dims", "dim_letters", "dims_evidence")}
    if evidence.notes:
        meta.setdefault("notes", []).extend(evidence.notes)
        filled["notes"] = list(meta["notes"])
    with contextlib.suppress(TypeError):  # a model that cannot be weakly referenced
        _MEMO[subject.model] = (key, ([(r.dims, r.why) for r in named], filled))
    return named


def gather(
    subject: Subject,
    steps: Sequence[Step],
    tensors: Sequence[TensorRecord],
    shapes_pass: passes_mod.ShapesPass,
    naming: str = "proven",
) -> Evidence:
    """Every piece of evidence for ``naming``, as plain data (:class:`Evidence`)."""
    house = house_sizes(subject.config, subject.model, subject.first_input_shape)
    letters = letter_sizes(house, subject.config, subject.model, subject.given)
    for letter, size in sizes_from_comments(steps, tensors, house).items():
        letters.setdefault(letter, size)
    letters.update(sizes_from_source(steps, tensors, letters))
    evidence = Evidence(
        letters=letters,
        attributes=attribute_letters(subject.model),
        contracts=layer_contracts(subject.model),
        param_paths=dict(subject.param_paths),
        info={"naming": naming},
    )
    if naming == "ops":
        evidence.info.update({"pass": None, "why_not": "naming='ops'"})
        return evidence
    sizes1 = {k: v.size for k, v in letters.items()}
    other, why = _inputs_pass(subject, sizes1, shapes_pass)
    if other is None:
        evidence.info.update({"pass": None, "why_not": why})
        evidence.notes.append(
            f"dims: no second pass at other input sizes ({why}); axes that move with the "
            "inputs are named only where the ops carry them from the first input"
        )
    else:
        shapes = aligned_shapes(steps, tensors, other.steps, other.shapes)
        if other.cut is not None:  # it stopped where its stack only repeats: filled in
            shapes = fill_repeats(steps, tensors, shapes, other.cut)
            evidence.info["stopped_at"] = ".".join(map(str, other.cut))
        sizes2 = dict(sizes1, B=other.b)
        if "T" in sizes1:
            sizes2["T"] = other.t
        evidence.inputs = Pass("inputs", other.how, sizes2, shapes, other.seconds)
        evidence.info.update(
            {"pass": other.how, "B": other.b, "T": other.t, "pass_seconds": other.seconds}
        )
        if other.meta_failed:
            evidence.info["meta_failed"] = other.meta_failed
    if naming in ("full", "proven"):
        _knob_passes(subject, steps, tensors, evidence, shapes_pass, every=naming == "full")
    return evidence


# --------------------------------------------------------------------------- passes


def _inputs_pass(subject: Subject, sizes1: Mapping[str, int], shapes_pass):
    if not passes_mod.ENABLED:
        return None, "turned off"
    if torch._C._len_torch_function_stack() > 0:
        return None, "another tracer (or torch function mode) is active around this one"
    if subject.distributed:
        return None, "torch.distributed: a second pass would run collectives"
    if subject.call is None:
        return None, "the forward did not complete"
    if "B" not in sizes1:
        return None, "the first input has no batch axis"
    constants = {v for k, v in sizes1.items() if k not in INPUT_LETTERS}
    return passes_mod.run_other(
        subject.model, subject.call, sizes1["B"], sizes1.get("T", -1), constants,
        sizes1.get("N"), subject.train, subject.ops, shapes_pass,
    )  # fmt: skip


def tied_knobs(
    steps: Sequence[Step],
    tensors: Sequence[TensorRecord],
    evidence: Evidence,
    config: Any = None,
) -> list[str]:
    """The config knobs behind names that still tie on some axis: two names that give the
    axis's sizes in every pass so far (``H`` and ``D/2`` both 64, both constant). A letter
    read from ``config.X`` is moved by ``X``; one derived from others (``D = C / H``), by
    theirs. Knobs in the order their letters are preferred."""
    sizes1 = {k: v.size for k, v in evidence.letters.items()}
    inputs = evidence.inputs
    table = Table([sizes1, inputs.sizes if inputs else None])
    by_sig: dict[tuple, list[str]] = {}

    def settable(letter: str) -> bool:  # a size the config stores, which a pass can move
        knob = _knob_of(evidence.letters.get(letter))
        return knob is not None and passes_mod.settable(config, knob)

    for name, sig in table.every:
        if name in LETTERS or ("/" in name and "·" not in name):  # letters, ratios, halves
            by_sig.setdefault(sig, []).append(name)
        elif "·" in name and all(settable(x) for x in letters_in(name)):
            by_sig.setdefault(sig, []).append(name)  # a product of knobs set apart (H·D, C)
    ties = {sig: names for sig, names in by_sig.items() if len(names) > 1 and sig[0] > 1}
    tied: set[str] = set()
    for sig in _axis_pairs(tensors, inputs):
        for name in ties.get(sig, ()):
            tied.update(letters_in(name))
    knobs: list[str] = []
    if isinstance(config, Mapping):  # a constructor's arguments: each is a size of the model
        sizes = {sig[0] for _, sig in table.every if sig[0] > 1}  # letters, 3C, D/2...
        unspelled = {k: v for k, v in config.items() if k not in _SPELLINGS and v in sizes}
        for knob, size in unspelled.items():  # patch_size 4 beside num_heads 4: a tie no
            knobs.append(knob)  # letter shows, which a pass moving each of them settles
            tied.update(k for k, v in sizes1.items() if v == size and k not in INPUT_LETTERS)
    for letter in evidence.letters:
        if letter not in tied or letter in INPUT_LETTERS:
            continue
        origin = evidence.letters[letter].origin
        for part in _origin_letters(origin, evidence):
            knob = _knob_of(evidence.letters.get(part))
            if knob is not None and knob not in knobs:
                knobs.append(knob)
    return knobs


def _axis_pairs(tensors: Sequence[TensorRecord], inputs: Pass | None) -> set[tuple]:
    """Every distinct ``(size in the trace, size in the inputs pass)`` of an axis (a
    parameter's never moves; an unpaired tensor's counts as unmoved)."""
    out: set[tuple] = set()
    for r in tensors:
        other = inputs.shapes[r.id] if inputs else None
        paired = other is not None and len(other) == len(r.shape)
        fixed = r.role in ("param", "buffer")
        for i, size in enumerate(r.shape):
            out.add((size, size if fixed or not paired else other[i]))
    return out


def _origin_letters(origin: str, evidence: Evidence) -> list[str]:
    """The letters an origin is made of: ``config.X`` is its own; ``C / H`` is C's and H's."""
    if origin.startswith("config.") and " " not in origin:
        return [k for k, v in evidence.letters.items() if v.origin == origin][:1]
    return [w for w in origin.replace("/", " ").replace("×", " ").split() if w in evidence.letters]


def _knob_of(sized) -> str | None:
    if sized is None or not sized.origin.startswith("config."):
        return None
    knob = sized.origin.split()[0].removeprefix("config.")
    return knob if knob.isidentifier() else None


def _knob_passes(subject, steps, tensors, evidence: Evidence, shapes_pass, every: bool) -> None:
    """One pass per letter behind a tie (``every``: per letter read from the config, those
    behind ties first): the first of its config spellings whose move moves some axis of the
    trace (a config may carry aliases the model never reads: ``d_model`` beside
    ``hidden_size``)."""
    rebuild = subject.rebuild or default_rebuild(subject.model)
    if rebuild is None or subject.call is None or subject.distributed or not passes_mod.ENABLED:
        return
    order = tied_knobs(steps, tensors, evidence, subject.config)
    # a constructor's arguments (tracing.Constructor) are each a size of their own, never
    # an alias of another (embed_dim beside hidden_size): every one gets its pass
    arguments = isinstance(subject.config, Mapping)
    if every or arguments:
        order += [
            k for k in (_knob_of(v) for v in evidence.letters.values()) if k and k not in order
        ]
    if arguments:
        order += [k for k in subject.config if k not in order]
    if every:  # "full": also the sizes no letter spells that an unnamed axis has (a pass
        # each: by default, names are proven without them, and traces stay cheaper)
        order += [k for k in unnamed_knobs(tensors, evidence, subject.config) if k not in order]
    read_from = {letter: _knob_of(v) for letter, v in evidence.letters.items()}
    sizes1 = {k: v.size for k, v in evidence.letters.items()}
    kinds = [step_kind(s) for s in steps]
    ran, failed, done, still = [], {}, set(), set()
    own: dict[str, tuple] = {}  # knob -> (its size, its pass's sizes, its pass's config)
    for first in order:
        letter = _SPELLINGS.get(first)  # None: a knob no letter spells (patch_size)
        if arguments and read_from.get(letter) != first:
            letter = None  # another argument of the letter's spelling: a knob of its own
        if (letter is not None and letter in done) or len(ran) >= MAX_KNOB_PASSES:
            continue
        spellings = [first] if arguments else None
        for knob in spellings or _spellings_of(first, letter, subject.config, sizes1.get(letter)):
            if not passes_mod.settable(subject.config, knob):
                continue  # not a size this config stores
            other, config, why = passes_mod.run_knob(
                subject.model, rebuild, subject.config, knob, subject.call,
                subject.train, subject.ops, shapes_pass, avoid=set(sizes1.values()),
            )  # fmt: skip
            if other is not None and [step_kind(s) for s in other.steps] != kinds:
                other, why = None, "its steps differ from the trace's (another path)"
            shapes = (
                None if other is None else aligned_shapes(steps, tensors, other.steps, other.shapes)
            )
            if shapes is not None and all(
                a is None or a == r.shape for a, r in zip(shapes, tensors)
            ):
                other, why = None, "moves no axis of the trace (the model does not read it)"
                still.add(letter)
            if other is None:
                failed[knob] = why
                continue
            house = house_sizes(config, other.twin, subject.first_input_shape)
            letters = letter_sizes(house, config, other.twin, subject.given, merge_same=False)
            sizes = dict(sizes1)
            sizes.update({k: v.size for k, v in letters.items() if k in sizes})
            if letter in sizes:  # the knob itself, whatever alias the reader met first
                sizes[letter] = passes_mod.read_knob(config, knob)
            evidence.knobs.append(Pass(f"config.{knob}", other.how, sizes, shapes, other.seconds))
            ran.append(knob)
            if letter is not None:
                done.add(letter)
            else:  # no letter: the axes it alone moves are named after it
                own[knob] = (passes_mod.read_knob(subject.config, knob), sizes, config)
            break
    _name_after_knobs(evidence, own)
    # a letter none of whose spellings moves any axis loses a tie to one that is not so
    # (a config's max_position_embeddings where the rotary tables follow T, beside a chunk
    # of that size); it is kept otherwise: the model may read its size under another name
    for letter in still - done:
        if letter is not None and letter in evidence.letters:
            evidence.unread[letter] = evidence.letters[letter]
    if ran:
        evidence.info["knobs"] = ran
    if failed:
        evidence.info["knobs_failed"] = failed


def unnamed_knobs(tensors: Sequence[TensorRecord], evidence: Evidence, config: Any) -> list[str]:
    """The config's sizes no letter spells (``hc_count``, ``hc_lowrank``) that an axis no
    name fits has: a pass moving each tells whether that axis is it (then named after it)."""
    if config is None:
        return []
    sizes1 = {k: v.size for k, v in evidence.letters.items()}
    inputs = evidence.inputs
    table = Table([sizes1, inputs.sizes if inputs else None])
    open_sizes = {  # no letter fits it (an expression may: 2KV)
        pair[0]
        for pair in _axis_pairs(tensors, inputs)
        if pair[0] > 1 and not any(c in LETTERS for c in table.candidates(pair))
    }
    text = text_config(config)
    try:
        fields = dict(text) if isinstance(text, Mapping) else dict(vars(text))
    except TypeError:
        return []
    return [
        k
        for k, v in fields.items()
        if isinstance(v, int) and not isinstance(v, bool) and v in open_sizes
        and k not in _SPELLINGS and not k.startswith("_")
    ]  # fmt: skip


def _name_after_knobs(evidence: Evidence, own: Mapping[str, tuple]) -> None:
    """A constructor argument no letter spells (``patch_size``, ``num_classes``) whose pass
    moved some axis becomes a name of its own: its size in each pass (moved in its own),
    so an axis that moves with it alone, and with nothing else, is named after it."""
    passes = [p for p in (evidence.inputs, *evidence.knobs) if p is not None]
    for knob, (size, sizes, config) in own.items():
        if size is None or size <= 1:
            continue
        column = [passes_mod.read_knob(config, knob) if p.sizes is sizes else size for p in passes]
        if any(  # a letter read off the model that this knob moves, and nothing else
            letter not in INPUT_LETTERS
            and sized.size == size
            and [p.sizes.get(letter) for p in passes] == column
            for letter, sized in evidence.letters.items()
        ):
            continue  # does (num_tokens: the embedding's rows, V): that letter, proven
        evidence.letters[knob] = Sized(size, f"config.{knob}")
        for p, value in zip(passes, column):
            p.sizes[knob] = value


_SPELLINGS = {name: letter for letter, spec in LETTERS.items() for name in spec.config}
"""Config attribute -> the letter it sizes."""


def _spellings_of(first: str, letter: str | None, config: Any, size: int | None) -> list[str]:
    """``first``, then the letter's other config spellings that hold the same size."""
    out = [first]
    for name in LETTERS[letter].config if letter in LETTERS else ():
        if name not in out and size is not None and passes_mod.read_knob(config, name) == size:
            out.append(name)
    return out


def default_rebuild(model: Any):
    """How a model is rebuilt for a knob pass when the caller gives no ``rebuild``: a model
    whose class takes its own ``.config`` as its one argument (a Hugging Face model, ours)
    is ``type(model)(config)``. Anything else is not rebuilt: its knobs are unknown."""
    config = getattr(model, "config", None)
    if config is None or not (
        dataclasses.is_dataclass(config) or callable(getattr(config, "to_dict", None))
    ):
        return None
    cls = type(model)
    attention = getattr(config, "_attn_implementation", None)  # the same kernels, not sdpa

    def rebuild(new_config: Any) -> Any:
        twin = cls(new_config)
        setter = getattr(twin, "set_attn_implementation", None)
        if attention is not None and callable(setter):
            setter(attention)
        return twin

    return rebuild


# --------------------------------------------------------------------------- memo

_MEMO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""model -> (what its last trace looked like, the names given to it and the meta filled)."""


def _memo_key(steps: Sequence[Step], tensors: Sequence[TensorRecord], subject, naming) -> tuple:
    """Everything the names depend on, cheaply comparable: the steps (their ops, sources
    and data flow), every record's shape and role, the sizes, the options."""
    return (
        # the root call's line is the caller's, which changes from call to call
        tuple(
            (s.kind, s.module, s.op, s.parent is not None and s.source, s.inputs, s.outputs)
            for s in steps
        ),
        tuple((r.shape, r.role, r.producer) for r in tensors),
        subject.first_input_shape,
        id(subject.config),
        tuple(sorted((subject.given or {}).items())),
        subject.call is None,
        subject.train,
        subject.ops,
        subject.distributed,
        naming,
        passes_mod.ENABLED,
    )


def _with_dims(record: TensorRecord, dims, why) -> TensorRecord:
    return built(TensorRecord, {**record.__dict__, "dims": dims, "why": why})
