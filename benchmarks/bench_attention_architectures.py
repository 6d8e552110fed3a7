"""Attention features on every causal-LM architecture of the installed ``transformers``.

    .venv/bin/python benchmarks/bench_attention_architectures.py              # all of them
    .venv/bin/python benchmarks/bench_attention_architectures.py llama falcon # only these
    .venv/bin/python benchmarks/bench_attention_architectures.py --failing    # last misses

Each architecture is built the way ``bench_dims_architectures.py`` builds it (its
``build``: the same shrunken config, seed and ids, B=3, T=11, H=6, D=16; imported, not
copied), then, for the architectures that build and run:

- **eager maps**: the eager model traced at ``capture="shapes"``; ``trace.attention_maps()``
  against its own ``output_attentions``, marked as below.
- **sdpa maps**: the same weights with ``attn_implementation="sdpa"`` (a copy of the eager
  model, switched with ``set_attn_implementation``; ``-`` where the model has no sdpa path)
  traced at ``capture="shapes"``; ``trace.attention_maps()`` against eager's
  ``output_attentions`` at ``rtol=1e-5, atol=1e-6`` (as ``test_fused_attention.py``):
  ``=``, ``≠`` with the count, shape or largest difference, or ``-`` (eager returns none).
- **head edit (eager, sdpa)**: the attention module of the last map the trace made (its
  key is the module's path), ``Edit(path, Zero(), head=H // 2)`` traced at ``values``,
  against weight surgery: head ``h``'s input columns ``h·D:(h+1)·D`` of that attention's
  output projection zeroed (rows of a GPT-2 ``Conv1D``). The projection is found from the
  trace's data flow, not from names: the first ``nn.Linear`` / ``Conv1D`` the per-head
  output (the step that multiplies the map with the values, or the fused call) flows into,
  through ops that keep heads apart (views, transposes, a gate's ``mul``), with ``H`` from
  the map and ``D`` the per-head output's width (BERT's is ``attention.output.dense``,
  outside ``attention.self``). Where there is none, it is reached only through an op that
  mixes the heads (a norm over ``H·D``), or it does not take ``H·D``, the row says ``?``
  and why, rather than guess. ``=`` / ``≠ max diff`` /
  ``error: message`` / ``?`` (``run_edited``, the same edit on hooks alone, must agree
  with the trace's); ``= (no effect)`` when the surgery does not change the
  logits at all (nothing was tested); ``-`` where neither the trace nor eager has a map
  (a state-space model, a hybrid built with mixer layers only).

A summary counts each column and lists the misses with their reasons. A run writes its rows
to ``benchmarks/.attention_architectures.json`` (``--failing`` reads it).
"""

from __future__ import annotations

import contextlib
import copy
import json
import sys
import time
import warnings
from pathlib import Path

import torch
from bench_dims_architectures import (
    _attentions,
    _limit,
    architectures,
    build,
    quiet,
    survey_arguments,
)
from torch import nn
from tracing.edits import Edit, Zero

import tracing
from tracing.runs.edit_run import run_edited

LAST = Path(__file__).with_name(".attention_architectures.json")
COLUMNS = ("eager_maps", "sdpa_maps", "edit_eager", "edit_sdpa")
SECONDS = 90


def _short(e: BaseException, n: int = 110) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:n]}"


# --------------------------------------------------------------------------- maps


def compare_maps(trace, eager: list[torch.Tensor]) -> str:
    if not eager:
        return "-"
    mine = list(trace.attention_maps().values())
    if len(mine) != len(eager):
        return f"≠ {len(mine)} maps, eager {len(eager)}"
    for i, (a, b) in enumerate(zip(mine, eager)):
        if a.shape != b.shape:
            return f"≠ map {i}: shape {tuple(a.shape)}, eager {tuple(b.shape)}"
        if not torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-6):
            diff = (a.float() - b.float()).abs().max().item()
            return f"≠ map {i}: max diff {diff:.2e}"
    return "="


def sdpa_copy(model):
    """The eager ``model``'s weights with sdpa attention, or None where it has none: the
    model switched in place where it can be (``set_attn_implementation``), else built again
    with sdpa and given the eager model's state dict (Falcon's attention reads its
    implementation at construction)."""
    other = copy.deepcopy(model)
    with contextlib.suppress(Exception):
        other.set_attn_implementation("sdpa")
    if getattr(other.config, "_attn_implementation", None) == "sdpa":
        return other
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            other = type(model)._from_config(
                copy.deepcopy(model.config), attn_implementation="sdpa"
            )
        other.load_state_dict(model.state_dict())
    except Exception:
        return None
    if getattr(other.config, "_attn_implementation", None) != "sdpa":
        return None
    return other.eval()


# --------------------------------------------------------------------------- head edits


def _conv1d():
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover
        return ()
    return (Conv1D,)


def _in_features(module) -> int | None:
    if isinstance(module, nn.Linear):
        return module.in_features
    if isinstance(module, _conv1d()):
        return module.weight.shape[0]  # Conv1D: (in, out), x @ W
    return None


def _per_head_output(trace, rec):
    """The step that makes the per-head output from map ``rec``: the fused call that made
    it, or the op that multiplies it with the values (after casts, dropout, a slice: GPT-OSS
    drops its sink column first); None when there is none."""
    producer = trace.steps[rec.producer]
    if producer.op == "scaled_dot_product_attention" and producer.outputs:
        return producer
    same = {rec.id}
    for s in trace.steps[rec.producer + 1 :]:
        if same.isdisjoint(s.inputs) or not s.outputs:
            continue
        if s.op in ("matmul", "bmm", "einsum"):
            return s
        if s.op in ("getitem", "to", "type_as", "dropout", "contiguous", "float", "masked_fill"):
            same.add(s.outputs[0])
        elif s.op in ("view", "reshape") and _refolds(trace, s, rec):
            same.add(s.outputs[0])  # (B, H, T, S) <-> (B·H, T, S): XGLM, Bloom
    return None


def _refolds(trace, step, rec) -> bool:
    """A view of the map that folds its heads into the batch or unfolds them."""
    shape, like = (
        tuple(trace.tensor(step.outputs[0]).shape),
        tuple(trace.tensor(step.inputs[0]).shape),
    )
    return {len(shape), len(like)} == {3, 4} and shape[-2:] == like[-2:]


def _heads(trace, rec) -> int | None:
    """H of map ``rec``: ``(B, H, T, S)``, or ``(B·H, T, S)`` with the trace's B."""
    if len(rec.shape) == 4:
        return rec.shape[1]
    B = ((trace.meta.get("dim_letters") or {}).get("B") or {}).get("size")
    if len(rec.shape) == 3 and B and rec.shape[0] % B == 0:
        return rec.shape[0] // B
    return None


# ops that keep each head's values apart (a zeroed head stays zero, the others unchanged)
_PER_HEAD = {
    "view", "view_as", "reshape", "reshape_as", "transpose", "permute", "contiguous",
    "flatten", "unflatten", "to", "float", "type", "clone", "dropout", "squeeze", "unsqueeze",
    "mul", "getitem",
}  # fmt: skip


def _projection(model, trace, start):
    """(path, module, mixed by) of the first linear (or ``Conv1D``) the per-head output made
    at step ``start`` flows into, with the first op on the way that may mix the heads (a
    norm over ``H·D``, BitNet's ``attn_sub_norm``; None when every op keeps them apart), or
    a string saying why there is none."""
    reached = {start.outputs[0]}
    clean = {start.outputs[0]}
    mixed_by = None
    for s in trace.steps[start.index + 1 :]:
        hit = [i for i in s.inputs if i in reached]
        if not hit:
            continue
        if s.kind == "module":
            try:
                sub = model.get_submodule(s.module)
            except AttributeError:
                sub = None
            if sub is not None and _in_features(sub) is not None:
                return s.module, sub, (None if all(i in clean for i in hit) else mixed_by)
            continue  # its ops follow
        reached.update(s.outputs)
        if s.op in _PER_HEAD and all(i in clean for i in hit):
            clean.update(s.outputs)
        elif mixed_by is None:
            mixed_by = f"{s.module}:{s.op}"
    return "no linear takes the per-head output"


def head_plan(model, trace):
    """(path, head, projection path, columns slice, is Conv1D, mixed by) for the last
    attention map's module, or a string saying why there is none to compare with."""
    maps = [r for r in trace.tensors if r.role == "attention" and r.producer is not None]
    if not maps:
        return "no attention map in the trace"

    def owner(module: str) -> str:  # CPM-Ant's softmax runs in an nn.Softmax child
        softmax = isinstance(model.get_submodule(module), nn.Softmax)
        return module.rpartition(".")[0] if softmax else module

    path = owner(trace.steps[maps[-1].producer].module)
    for rec in maps:  # the last module's maps (a softmax, the view it returns...)
        if owner(trace.steps[rec.producer].module) != path or _heads(trace, rec) is None:
            continue
        step = _per_head_output(trace, rec)
        if step is not None:
            break
    else:
        return f"no per-head output after a map at {path}"
    H = _heads(trace, rec)
    D = trace.tensor(step.outputs[0]).shape[-1]
    found = _projection(model, trace, step)
    if isinstance(found, str):
        return f"{path}: {found}"
    proj_path, proj, mixed_by = found
    runs = sum(s.kind == "module" and s.module == proj_path for s in trace.steps)
    calls = sum(s.kind == "module" and s.module == path for s in trace.steps)
    if runs > calls:  # ProphetNet: one out_proj for its main and its predicting streams
        return (
            f"{proj_path} runs {runs} times in {calls} call(s) of {path} (streams sharing "
            "one projection: its columns are not one call's head)"
        )
    n = _in_features(proj)
    if n != H * D:
        return f"{proj_path} takes {n}, not H·D = {H}·{D}"
    h = H // 2
    cols = slice(h * D, (h + 1) * D)
    return path, h, proj_path, cols, not isinstance(proj, nn.Linear), mixed_by


def _logits(out):
    return out.logits if hasattr(out, "logits") else out[0]


def compare_head_edit(model, ids, trace, eager_maps: int = 1) -> tuple[str, str]:
    """(mark, detail) of one head edit by module path against weight surgery; ``?`` for a
    miss where an op between the heads and the projection may mix them (no like-for-like
    surgery there), ``=`` still where the two agree all the same (a per-head norm)."""
    mark, detail, mixed_by = _head_edit(model, ids, trace, eager_maps)
    if mixed_by and mark != "=" and not mark.startswith("= ("):
        return "?", f"{detail}; the heads may be mixed by {mixed_by} before the projection"
    return mark, detail


def _head_edit(model, ids, trace, eager_maps: int):
    plan = head_plan(model, trace)
    if plan == "no attention map in the trace" and not eager_maps:
        return "-", "no attention map here, nor from output_attentions: no heads to edit", None
    if isinstance(plan, str):
        return "?", plan, None
    path, h, proj_path, cols, conv, mixed_by = plan
    where = f"{path} head {h}"
    try:
        with _limit(SECONDS):
            edited = tracing.trace(model, ids, capture="values", edits=[Edit(path, Zero(), head=h)])
            got = edited.value(edited.steps[0].outputs[0])
    except BaseException as e:
        return "error", f"{where}: {_short(e, 200)}", mixed_by
    try:  # the same edit on hooks alone (no trace kept): it must give the same logits
        with _limit(SECONDS), torch.no_grad():
            hooked = _logits(run_edited(model, ids, edits=[Edit(path, Zero(), head=h)]))
    except BaseException as e:
        return "error", f"{where}: run_edited: {_short(e, 200)}", mixed_by
    if not torch.allclose(hooked.float(), got.float(), rtol=1e-5, atol=2e-6):
        diff = (hooked.float() - got.float()).abs().max().item()
        return f"≠ {diff:.1e}", f"{where}: run_edited differs from the trace's edit", mixed_by
    surgery = copy.deepcopy(model)
    proj = surgery.get_submodule(proj_path)
    with torch.no_grad():  # its own copy: a weight tied across layers (Zamba's shared
        proj.weight = nn.Parameter(proj.weight.clone())  # block) changes this layer only
        if conv:
            proj.weight[cols, :] = 0
        else:
            proj.weight[:, cols] = 0
        want = _logits(surgery(ids)).float()
        base = _logits(model(ids)).float()
    got = got.float()
    if got.shape != want.shape:
        return (
            "error",
            f"{where}: edited output {tuple(got.shape)}, logits {tuple(want.shape)}",
            mixed_by,
        )
    if torch.equal(want, base):
        return "= (no effect)", f"{where}: zeroing {proj_path} columns changes nothing", mixed_by
    if torch.allclose(got, want, rtol=1e-5, atol=2e-6):
        return "=", where, mixed_by
    diff = (got - want).abs().max().item()
    moved = (base - want).abs().max().item()
    detail = f"{where} via {proj_path}: max diff {diff:.2e} (the surgery moved {moved:.2e})"
    return f"≠ {diff:.1e}", detail, mixed_by


# --------------------------------------------------------------------------- one architecture


def survey_one(model_type: str) -> dict:
    row: dict = {"model": model_type}
    started = time.perf_counter()
    try:
        with _limit(SECONDS):
            model, ids = build(model_type)
        with _limit(SECONDS), torch.no_grad():
            model(ids)
    except BaseException as e:
        return {**row, "skip": _short(e)}
    try:
        with _limit(SECONDS):
            eager = _attentions(model, ids)
    except BaseException:
        eager = []
    details: dict = {}
    sdpa = sdpa_copy(model)
    for name, m in (("eager", model), ("sdpa", sdpa)):
        if m is None:
            row["sdpa_maps"] = row["edit_sdpa"] = "-"
            details["sdpa"] = "no sdpa path"
            continue
        try:
            with _limit(SECONDS):
                trace = tracing.trace(m, ids, capture="shapes")
        except BaseException as e:
            row[f"{name}_maps"] = "error"
            row[f"edit_{name}"] = "error"
            details[name] = f"trace: {_short(e, 200)}"
            continue
        if name == "eager":
            row["eager_maps"] = compare_maps(trace, eager)
        if name == "sdpa":
            row["sdpa_maps"] = compare_maps(trace, eager)
            fused = sum(s.op == "scaled_dot_product_attention" for s in trace.steps)
            row["sdpa_calls"] = fused
            if not fused:  # switched, yet it never calls the fused kernel: not an sdpa test
                details["sdpa"] = "sdpa set, but no scaled_dot_product_attention call ran"
                row["sdpa_maps"] = "- (no call)"
        row[f"edit_{name}"], details[f"edit_{name}"] = compare_head_edit(m, ids, trace, len(eager))
    row["details"] = details
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def _bad(mark: str) -> bool:
    return mark.startswith(("≠", "error", "?"))


def misses(row: dict) -> list[str]:
    if "skip" in row:
        return []
    out = []
    for col in COLUMNS:
        mark = row.get(col, "-")
        if _bad(mark):
            key = {"sdpa_maps": "sdpa", "eager_maps": "eager"}.get(col, col)
            out.append(f"{col} {mark}: {row['details'].get(key, '')}".rstrip(": "))
    return out


def summary(rows: list[dict]) -> dict:
    ran = [r for r in rows if "skip" not in r]
    counts = {}
    for col in COLUMNS:
        c: dict[str, int] = {}
        for r in ran:
            mark = r.get(col, "-")
            key = mark.split(" ")[0] if not mark.startswith("= (") else mark
            c[key] = c.get(key, 0) + 1
        counts[col] = dict(sorted(c.items()))
    return {"architectures": len(rows), "ran": len(ran), "skipped": len(rows) - len(ran), **counts}


def _line(row: dict) -> str:
    if "skip" in row:
        return f"{row['model']:<28} skip  {row['skip']}"
    marks = "  ".join(f"{c} {row.get(c, '-'):<6}" for c in COLUMNS)
    text = f"{row['model']:<28} {marks} {row['seconds']:5.1f} s"
    for m in misses(row):
        text += "\n    " + m
    return text


def main() -> None:
    args = survey_arguments(__doc__).parse_args()
    quiet(args.threads)
    names = args.models or architectures()
    if args.failing and LAST.exists():
        names = [r["model"] for r in json.loads(LAST.read_text()) if misses(r)]
    rows = []
    started = time.perf_counter()
    for name in names:
        row = survey_one(name)
        rows.append(row)
        print(_line(row), flush=True)
    s = summary(rows)
    print(f"\n{s['architectures']} architectures in {time.perf_counter() - started:.0f} s")
    print(f"ran {s['ran']} (skipped {s['skipped']}: no build or no plain forward here)")
    for col in COLUMNS:
        print(f"{col:<11} " + ", ".join(f"{k} {v}" for k, v in s[col].items()))
    failures = [(r["model"], m) for r in rows for m in misses(r)]
    print(f"\n{len(failures)} misses:" if failures else "\nno misses")
    for model, m in failures:
        print(f"  {model}: {m}")
    if not args.models and not args.failing:
        LAST.write_text(json.dumps(rows, indent=1))
    elif LAST.exists():
        last = {r["model"]: r for r in json.loads(LAST.read_text())}
        last.update({r["model"]: r for r in rows})
        LAST.write_text(json.dumps(list(last.values()), indent=1))


if __name__ == "__main__":
    sys.exit(main())
