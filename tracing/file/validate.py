"""Validation of a manifest from anyone: every field and cross-reference checked.

A file may come from a stranger, so nothing in it is used before it is checked; the
first problem found becomes one :class:`~tracing.errors.TraceFileError` naming it.
"""

from __future__ import annotations

from dataclasses import MISSING as MISSING_FIELD
from dataclasses import fields
from functools import partial
from itertools import chain, repeat
from typing import Any

from tracing.file.layout import MAX_INT, MAX_RECORDS, RESERVED_PREFIX, STATS_FIELDS, Invalid
from tracing.file.manifest import check_trace, consistent, decode_value
from tracing.file.postmortem import failure_from_json, sources_from_json
from tracing.record import (
    ModuleInfo,
    SourceLocation,
    Step,
    TensorRecord,
    TensorStats,
    Trace,
)

# --------------------------------------------------------------------------- validate


class _Bad(Exception):
    """A field value of the wrong type (the caller names the record and field)."""


def _as_int(v: Any) -> int:
    if type(v) is not int or not -MAX_INT <= v <= MAX_INT:
        raise _Bad("a whole number")
    return v


def _as_opt_int(v: Any) -> int | None:
    if v is not None and (type(v) is not int or not -MAX_INT <= v <= MAX_INT):
        raise _Bad("a whole number or null")
    return v


def _as_str(v: Any) -> str:
    if type(v) is not str:
        raise _Bad("text")
    return v


def _as_opt_str(v: Any) -> str | None:
    if v is not None and type(v) is not str:
        raise _Bad("text or null")
    return v


def _as_int_tuple(v: Any) -> tuple[int, ...]:
    if type(v) is not list or not set(map(type, v)) <= {int}:
        raise _Bad("a list of whole numbers")
    if v and not -MAX_INT <= min(v) <= max(v) <= MAX_INT:
        raise _Bad("a list of whole numbers")
    return tuple(v)


def _as_size_tuple(v: Any) -> tuple[int, ...]:
    if type(v) is not list or len(v) > 64 or not set(map(type, v)) <= {int}:
        raise _Bad("a list of at most 64 sizes")
    if v and not 0 <= min(v) <= max(v) <= MAX_INT:
        raise _Bad("a list of sizes")
    return tuple(v)


def _as_str_tuple(v: Any) -> tuple[str, ...]:
    if type(v) is not list or not set(map(type, v)) <= {str}:
        raise _Bad("a list of text")
    return tuple(v)


def _as_opt_str_tuple(v: Any) -> tuple[str, ...] | None:
    return None if v is None else _as_str_tuple(v)


def _as_any(v: Any) -> Any:
    """A field this version has no rule for (added later with a default): lists as tuples."""
    return tuple(v) if type(v) is list else v


# converters whose whole job, for a column of these types, is the type check (and the
# integer range check :func:`_decode_column` does for the column at once)
_PLAIN_KINDS: dict[Any, set[type]] = {
    _as_int: {int},
    _as_opt_int: {int, type(None)},
    _as_str: {str},
    _as_opt_str: {str, type(None)},
}
# converters of lists of one element type, decoded a whole column at once
_LIST_KINDS: dict[Any, type] = {
    _as_int_tuple: int,
    _as_size_tuple: int,
    _as_str_tuple: str,
    _as_opt_str_tuple: str,
}


# field name -> converter, per record type; "source" and "stats" are decoded apart
_STEP_RULES = {
    "index": _as_int,
    "kind": _as_str,
    "module": _as_str,
    "op": _as_str,
    "inputs": _as_int_tuple,
    "outputs": _as_int_tuple,
    "input_names": _as_str_tuple,
    "output_names": _as_str_tuple,
    "depth": _as_int,
    "parent": _as_opt_int,
    "end": _as_opt_int,
    "call": _as_int,
    "error": _as_opt_str,
    "forward": _as_opt_int,
}
_TENSOR_RULES = {
    "id": _as_int,
    "shape": _as_size_tuple,
    "dtype": _as_str,
    "device": _as_str,
    "dims": _as_opt_str_tuple,
    "value_key": _as_opt_str,
    "producer": _as_opt_int,
    "role": _as_opt_str,
    "grad_of": _as_opt_int,
    "why": _as_opt_str_tuple,
}
_MODULE_RULES = {
    "path": _as_str,
    "type": _as_str,
    "parent": _as_opt_str,
    "children": _as_str_tuple,
    "params": _as_int,
    "params_total": _as_int,
    "extra": _as_str,
}


def _decode_rows(
    manifest: dict[str, Any],
    table: str,
    cls: type,
    rules: dict[str, Any],
    what: str,
    special=None,
    shared: dict | None = None,
) -> tuple[list[Any], dict[str, Any]]:
    """Rows of one manifest table -> ``cls`` objects, every field type-checked, and the
    decoded columns by field name (for the checks across records).

    Fields are matched by name (a file may list them in any order; unknown ones are
    ignored; missing ones take the dataclass default or are an error if it has none).
    ``special`` maps a field name to a whole-column decoder ``(column) -> list`` for
    nested records (raising ``_Bad`` on a bad value). ``shared`` (see :func:`_one_each`)
    is the table of values the records share, across the tables of one manifest.
    """
    shared = {} if shared is None else shared
    t = manifest.get(table)
    if not isinstance(t, dict):
        raise Invalid(f"the manifest has no {table} table")
    names, rows = t.get("fields"), t.get("rows")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise Invalid(f"the {table} table has no list of field names")
    if not isinstance(rows, list):
        raise Invalid(f"the {table} table has no rows")
    if len(rows) > MAX_RECORDS:
        raise Invalid(f"the {table} table has more than {MAX_RECORDS:,} rows")
    special = special or {}
    plan = []  # (field name, column or None, column decoder, default)
    for f in fields(cls):
        decode = special.get(f.name) or partial(
            _decode_column, rules.get(f.name, _as_any), shared=shared
        )
        if f.name in names:
            plan.append((f.name, names.index(f.name), decode, None))
        elif f.default is not MISSING_FIELD:
            plan.append((f.name, None, None, f.default))
        else:
            raise Invalid(f"the {table} table has no {f.name!r} field")
    width = len(names)
    if not set(map(type, rows)) <= {list} or not set(map(len, rows)) <= {width}:
        i = next(i for i, r in enumerate(rows) if type(r) is not list or len(r) != width)
        raise Invalid(f"row {i} of the {table} table does not have {width} fields")
    # column by column: a whole column of plain ints or strings is checked in one C-speed
    # pass (a 50,000-step trace loads in a fraction of the per-value time)
    n = len(rows)
    columns = list(zip(*rows)) if rows else [() for _ in names]
    # the columns hold every value now: the row lists go (a third of the manifest's memory)
    t["rows"] = rows = None
    try:
        decoded = [
            repeat(default, n) if col is None else decode(columns[col])
            for _, col, decode, default in plan
        ]
    except _Bad:
        _raise_first_bad(columns, n, plan, what)
    columns = None  # and with them the lists the manifest gave each value in
    by_name = {
        name: column if col is not None else [default] * n
        for (name, col, _, default), column in zip(plan, decoded)
    }
    return _build(cls, decoded), by_name


def _build(cls: type, columns: list) -> list[Any]:
    """Frozen dataclass objects from checked columns, one per field, in field order.

    By the constructor: an object whose fields its ``__init__`` set keeps them in the
    compact per-class layout (Python 3.11+), a step in 230 bytes where a ``__dict__``
    assigned whole (``record.built``'s way, a third faster to build) takes 550: a
    100,000-step trace holds 45 MB less once loaded, and loads in the same time
    (``tests/tracing/file/test_load_memory.py``).
    """
    return list(map(cls, *columns))


def _decode_column(convert, column: tuple, shared: dict | None = None) -> Any:
    """``convert`` applied to every value of ``column``, with whole-column fast paths.

    A column of plain scalars, or of lists of plain ints or strings, is checked by a few
    passes in C (types as a set, one min/max) instead of a Python call per value; anything
    else, or anything that fails the fast check, goes through ``convert`` value by value
    (which names the first bad one). Text, and tuples of text, come back as one object
    per distinct value (:func:`_one_each`, into ``shared``).
    """
    shared = {} if shared is None else shared
    kinds = set(map(type, column))
    allowed = _PLAIN_KINDS.get(convert)
    if allowed is not None and kinds <= allowed:
        if int not in kinds:
            return _one_each(column, shared)
        numbers = column if kinds == {int} else [v for v in column if type(v) is int]
        if _in_range(numbers, -MAX_INT):
            return column
    element = _LIST_KINDS.get(convert)
    optional = convert is _as_opt_str_tuple and type(None) in kinds
    lists = [v for v in column if v is not None] if optional else column
    if element is not None and (kinds - {type(None)} if optional else kinds) <= {list}:
        flat = list(chain.from_iterable(lists))
        ok = set(map(type, flat)) <= {element}
        if ok and element is int:
            ok = _in_range(flat, 0 if convert is _as_size_tuple else -MAX_INT)
        if ok and convert is _as_size_tuple:
            ok = max(map(len, column), default=0) <= 64
        if ok and optional:
            return _one_each([None if v is None else tuple(v) for v in column], shared)
        if ok and convert in _SHARED_TUPLES:
            return _one_each(list(map(tuple, column)), shared)
        if ok:
            return list(map(tuple, column))
    return list(map(convert, column))


# tuples of text a trace repeats (input and output names; axis names are optional ones).
# Not shapes: a tuple of ints hashes the same in every process, so a stranger's file could
# hold a hundred thousand shapes of one hash and make sharing them quadratic; text hashes
# differ from one process to the next.
_SHARED_TUPLES = {_as_str_tuple}


def _one_each(column: Any, shared: dict) -> list:
    """``column`` with equal values as one object: ``json`` makes a new string for every
    occurrence, and a 100,000-step trace names a few hundred modules, ops, dtypes and
    inputs, each a hundred thousand times (the records then hold one copy of each: a
    third of the memory a loaded trace took)."""
    return list(map(shared.setdefault, column, column))


def _in_range(numbers, low: int) -> bool:
    return not numbers or (min(numbers) >= low and max(numbers) <= MAX_INT)


def _raise_first_bad(columns: list, n: int, plan: list, what: str) -> None:
    """The slow path for an error message: the first row and field that fails."""
    for i in range(n):
        for name, col, decode, _ in plan:
            if col is None:
                continue
            value = columns[col][i]
            try:
                decode((value,))
            except _Bad as e:
                where = f"steps[{i}]" if what == "step" else f"{what} {i}"  # see manifest
                raise Invalid(f"{where}: {name} {value!r} is not {e}") from None
    raise AssertionError("no bad value found")  # pragma: no cover


def validate(
    manifest: dict[str, Any], stored: dict[str, tuple[tuple[int, ...], str]] | None
) -> Trace:
    """Decode the manifest into a Trace, checking types and every cross-reference.

    ``stored`` gives the shape and dtype of the file's entries (None: do not check them).
    The manifest is taken apart as it is read (each table's rows dropped once its columns
    hold their values, so a long trace's JSON is not all alive beside its records): pass
    one that is not needed after.
    """
    raw_sources = manifest.get("sources", [])
    if not isinstance(raw_sources, list):
        raise Invalid("the manifest's sources is not a list")
    if len(raw_sources) > MAX_RECORDS:
        raise Invalid(f"the manifest has more than {MAX_RECORDS:,} sources")
    sources = [_source(row, i) for i, row in enumerate(raw_sources)]
    meta = manifest.get("meta", {})
    if not isinstance(meta, dict):
        raise Invalid("the manifest's meta is not a JSON object")
    meta = decode_value(meta)
    error = manifest.get("error")
    if error is not None and not isinstance(error, str):
        raise Invalid("the manifest's error is not text")

    shared: dict = {}  # one object per distinct text or tuple, across the tables
    module_list, _ = _decode_rows(
        manifest, "modules", ModuleInfo, _MODULE_RULES, "module record", shared=shared
    )
    modules = {m.path: m for m in module_list}
    if len(modules) != len(module_list):
        raise Invalid("a module path is listed twice in the modules table")

    stats_names = manifest.get("stats_fields", list(STATS_FIELDS))
    if (
        not isinstance(stats_names, list)
        or not all(type(n) is str for n in stats_names)
        or len(set(stats_names)) != len(stats_names)
    ):
        raise Invalid("the manifest's stats_fields is not a list of distinct names")

    tensors, tensor_columns = _decode_rows(
        manifest, "tensors", TensorRecord, _TENSOR_RULES, "tensor record",
        {"stats": partial(_stats_column, names=stats_names)}, shared,
    )  # fmt: skip
    as_source = partial(_source_column, sources=sources)
    steps, step_columns = _decode_rows(
        manifest, "steps", Step, _STEP_RULES, "step", {"source": as_source}, shared
    )
    del shared
    try:
        failure = failure_from_json(manifest.get("failure"), len(steps))
        embedded = sources_from_json(manifest.get("source_files"))
    except ValueError as e:
        raise Invalid(str(e)) from None
    trace = Trace(
        steps=steps, modules=modules, tensors=tensors, meta=meta, error=error,
        failure=failure, sources=embedded,
    )  # fmt: skip
    if not consistent(step_columns, tensor_columns, modules):
        check_trace(trace)  # names the first record that breaks a rule
    if stored is not None:
        for rec in tensors:
            if rec.value_key is not None:
                _check_stored(rec, stored, meta, f"tensor record {rec.id}")
    return trace


def _check_stored(
    rec: TensorRecord,
    stored: dict[str, tuple[tuple[int, ...], str]],
    meta: dict[str, Any],
    where: str,
) -> None:
    key = rec.value_key
    spec = stored.get(key)  # type: ignore[arg-type]
    if spec is None or key.startswith(RESERVED_PREFIX):  # type: ignore[union-attr]
        raise Invalid(f"{where} names tensor {key!r}, which is not in the file")
    shape, dtype = spec
    if shape != rec.shape:
        raise Invalid(
            f"tensor {key!r} is stored with shape {list(shape)} but its record ({where}) "
            f"says {list(rec.shape)}"
        )
    if dtype != rec.dtype:
        value_dtype = meta.get("value_dtype")
        downcast = isinstance(value_dtype, str) and _is_floating(rec.dtype) and _is_floating(dtype)
        if not downcast or dtype != value_dtype.removeprefix("torch."):
            raise Invalid(
                f"tensor {key!r} is stored as {dtype} but its record ({where}) says {rec.dtype}"
            )


def _is_floating(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def _source(row: Any, i: int) -> SourceLocation:
    if (
        type(row) is not list
        or len(row) != 4
        or type(row[0]) is not str
        or type(row[1]) is not int
        or type(row[2]) is not str
        or type(row[3]) is not str
    ):
        raise Invalid(f"source entry {i} is not [file, line, text, function]")
    return SourceLocation(file=row[0], line=row[1], text=row[2], function=row[3])


def _source_column(column: tuple, sources: list[SourceLocation]) -> list:
    """A steps table's source column (indices into the source table, or null) as
    ``SourceLocation`` objects (shared, one per source)."""
    if not set(map(type, column)) <= {int, type(None)}:
        raise _Bad("an entry of the source table")
    table: dict[int | None, SourceLocation | None] = dict(enumerate(sources))
    table[None] = None
    try:
        return list(map(table.__getitem__, column))
    except KeyError:
        raise _Bad("an entry of the source table") from None


def _stats_column(column: tuple, names: list[str]) -> list:
    """A tensors table's stats column (a list of numbers per row, in the order of the
    manifest's ``stats_fields``, or null) as ``TensorStats``, checked a field at a time;
    a column with anything unusual goes value by value (:func:`_stats` names the bad one)."""

    def one_by_one() -> list:
        return [None if v is None else _stats(v, names) for v in column]

    present = [v for v in column if v is not None]
    if not set(STATS_FIELDS) <= set(names) or not set(map(type, present)) <= {list}:
        return one_by_one()
    if not set(map(len, present)) <= {len(names)}:
        return one_by_one()
    by_name = dict(zip(names, zip(*present))) if present else dict.fromkeys(names, ())
    values = []
    for name in STATS_FIELDS:
        col = by_name[name]
        kinds = set(map(type, col))
        if name in ("nan", "inf"):  # counts
            if not kinds <= {int} or not _in_range(col, 0):
                return one_by_one()
        else:
            if not kinds <= {float, int}:
                return one_by_one()
            if int in kinds:
                if not _in_range([v for v in col if type(v) is int], -MAX_INT):
                    return one_by_one()
                col = list(map(float, col))
        values.append(col)
    built = _build(TensorStats, values)  # values: in STATS_FIELDS order, TensorStats's
    if len(built) == len(column):
        return built
    it = iter(built)
    return [None if v is None else next(it) for v in column]


def _stats(v: Any, names: Any) -> TensorStats:
    if type(v) is not list or not isinstance(names, list) or len(v) != len(names):
        raise _Bad(f"a list of {len(STATS_FIELDS)} numbers")
    d = dict(zip(names, v))
    try:
        mn, mx, mean, std, nan, inf = (d[k] for k in STATS_FIELDS)
    except KeyError:
        raise _Bad("a complete set of stats") from None
    for x in (mn, mx, mean, std):
        if type(x) is not float and (type(x) is not int or not -MAX_INT <= x <= MAX_INT):
            raise _Bad("a list of numbers")
    for n in (nan, inf):
        if type(n) is not int or not 0 <= n <= MAX_INT:
            raise _Bad("stats with whole-number NaN and Inf counts")
    return TensorStats(float(mn), float(mx), float(mean), float(std), nan, inf)
