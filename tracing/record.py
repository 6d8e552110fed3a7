"""The trace record: what one forward pass left behind, as plain frozen data.

This module is the contract between the tracer (which fills it), the trace file (which
stores it), the reports (which format it) and the desktop app (which shows it). It knows
nothing of Qt, of hooks, or of any particular model.

Names here are public API that scripts and the app rely on: keep them stable.

Vocabulary
----------
- A **step** is one event of the forward pass, in execution order: either a *module call*
  (``kind == "module"``; recorded at entry, so its index comes before the ops that ran
  inside it) or a *tensor operation* (``kind == "op"``: ``matmul``, ``transpose``, the
  residual ``+`` ...), recorded when it returns.
- A training-step trace (``tracing.trace_step``) adds *backward steps*
  (``kind == "backward"``), one per autograd node that ran, in execution order, after the
  forward ones; each points at the forward step it differentiates (``Step.forward``) and
  outputs gradient records (``role == "grad"``, ``TensorRecord.grad_of``).
- A **tensor record** describes one tensor value seen at a step boundary. Ids are indices
  into ``Trace.tensors``. The same tensor object passed along (a module's output that is
  its last op's output) keeps one id; an in-place op that changes it makes a new id.
- **dims** are symbolic axis names in the house letter set: ``B`` batch, ``T`` time,
  ``C`` d_model, ``H`` heads, ``D`` d_head, ``V`` vocab, ``F`` d_ff. ``None`` when unknown;
  a single axis may be ``"?"`` when only that one is unknown.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

from tracing.formatting import format_shape

if TYPE_CHECKING:  # pragma: no cover - imports for type checkers only
    import networkx as nx
    import torch

SCHEMA_VERSION = 1
"""Version of the on-disk manifest. Bump when a field changes meaning or is removed."""

CaptureLevel = Literal["shapes", "stats", "values"]
CAPTURE_LEVELS: tuple[str, ...] = ("shapes", "stats", "values")

StepKind = Literal["module", "op", "backward"]


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class SourceLocation:
    """Where in the user's Python source a step was called from."""

    file: str  # absolute path as Python saw it
    line: int  # 1-based
    text: str  # the stripped source line ("" if unavailable)
    function: str = ""  # enclosing function name, e.g. "split_heads"


@dataclass(frozen=True)
class TensorStats:
    """Summary statistics of one tensor (over finite elements for min/max/mean/std)."""

    min: float
    max: float
    mean: float
    std: float
    nan: int  # count of NaN elements
    inf: int  # count of +/-Inf elements

    @property
    def has_nonfinite(self) -> bool:
        return self.nan > 0 or self.inf > 0


@dataclass(frozen=True)
class TensorRecord:
    """One tensor as seen at a step boundary."""

    id: int  # index into Trace.tensors
    shape: tuple[int, ...]
    dtype: str  # torch dtype without the "torch." prefix, e.g. "float32"
    device: str = "cpu"  # e.g. "cpu", "cuda:0"
    dims: tuple[str, ...] | None = None  # symbolic axis names, e.g. ("B", "H", "T", "T")
    stats: TensorStats | None = None  # filled at capture "stats" and "values"
    value_key: str | None = None  # key into Trace.values when a copy was kept
    producer: int | None = None  # index of the innermost step that produced it
    role: str | None = None  # e.g. "attention" for attention weights, "input", "param", "grad"
    grad_of: int | None = None  # role "grad": id of the forward tensor it is the gradient of
    why: tuple[str, ...] | None = None  # per axis, what proves its name (tracing.dims)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def shape_str(self, symbolic: bool = True) -> str:
        """``(1, 4, 12, 12)``, or with dims ``(B=1, H=4, T=12, T=12)``."""
        return format_shape(self.shape, self.dims if symbolic else None)


@dataclass(frozen=True)
class Step:
    """One event of the forward pass."""

    index: int  # position in Trace.steps
    kind: StepKind  # "module" or "op"
    module: str  # dotted module path it ran in ("" for the root module)
    op: str  # op name ("matmul", "add", "view"...) or the module's type ("Linear")
    source: SourceLocation | None = None
    inputs: tuple[int, ...] = ()  # tensor ids
    outputs: tuple[int, ...] = ()  # tensor ids
    input_names: tuple[str, ...] = ()  # same length as inputs: "x", "mask", "args[0]", "self"
    output_names: tuple[str, ...] = ()  # same length as outputs: "output", "output[1]"
    depth: int = 0  # nesting depth: root module call is 0, ops inside it are 1, ...
    parent: int | None = None  # index of the enclosing module step
    end: int | None = None  # module steps: index of the last step inside this call
    call: int = 0  # module steps: 0 for the first call of that module, 1 for the second...
    error: str | None = None  # set on the step that raised (and enclosing module steps)
    forward: int | None = None  # backward steps: the forward step whose output it differentiates

    @property
    def label(self) -> str:
        """Short text for status bars: ``blocks.1.attn · matmul``."""
        where = self.module or "<root>"
        return f"{where} · {self.op}"


@dataclass(frozen=True)
class ModuleInfo:
    """One module of the traced model's hierarchy (whether it ran or not)."""

    path: str  # dotted path, "" for the root
    type: str  # class name, e.g. "MultiHeadAttention"
    parent: str | None  # None for the root
    children: tuple[str, ...] = ()  # direct children paths, in definition order
    params: int = 0  # parameters owned directly (recurse=False)
    params_total: int = 0  # parameters of the whole subtree (shared ones counted once)
    extra: str = ""  # module.extra_repr()

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1] if self.path else "<root>"

    @property
    def depth(self) -> int:
        return 0 if not self.path else self.path.count(".") + 1


@dataclass(frozen=True)
class Failure:
    """Why and where a forward pass stopped: a trace's post-mortem, as data.

    ``step`` is the innermost step that raised (an op such as a ``matmul`` whose operands
    do not fit, or the module whose own Python raised, e.g. a ``NameError``); ``location``
    is the user's line that raised, which need not be an op's line.
    """

    step: int  # index into Trace.steps
    location: SourceLocation | None  # the raising line (innermost frame of user code)
    type: str  # exception class name, e.g. "NameError"
    message: str  # str(exception), e.g. "name 'F' is not defined"

    def __str__(self) -> str:
        return f"{self.type}: {self.message}" if self.message else self.type


def built(cls: type, fields: dict[str, Any]) -> Any:
    """``cls(**fields)`` for a frozen record class, given every one of its fields, without
    its ``__init__``: a frozen dataclass sets each field through ``object.__setattr__``,
    which costs more than this, and a trace makes hundreds of records. The result equals,
    hashes and prints as the constructor's would (``tests/test_capture.py`` holds it)."""
    record = object.__new__(cls)
    record.__dict__.update(fields)
    return record


# --------------------------------------------------------------------------- the trace


@dataclass
class Trace:
    """Everything recorded from one forward pass.

    ``values`` maps ``TensorRecord.value_key`` to a tensor. For a fresh trace it is a dict
    of detached CPU copies; for a trace opened from a file it is a lazy mapping that reads
    each tensor from disk on first access.
    """

    steps: list[Step] = field(default_factory=list)
    modules: dict[str, ModuleInfo] = field(default_factory=dict)
    tensors: list[TensorRecord] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    values: Mapping[str, torch.Tensor] = field(default_factory=dict)
    error: str | None = None  # "ValueError: ..." when the forward raised; None if complete
    failure: Failure | None = None  # the same, as data: failing step, raising line, exception
    sources: dict[str, str] = field(default_factory=dict)  # file -> text the steps point at

    # ---- basic access

    @property
    def complete(self) -> bool:
        return self.error is None

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def tensor(self, tensor_id: int) -> TensorRecord:
        return self.tensors[tensor_id]

    def value(self, tensor_id: int) -> torch.Tensor | None:
        """The kept copy of a tensor, or None when none was kept (only shapes or stats
        were captured, or it was over the size cap) or its entry is missing."""
        key = self.tensors[tensor_id].value_key
        return None if key is None else self.values.get(key)

    # ---- training steps (tracing.trace_step): gradients and backward steps

    @property
    def backward_start(self) -> int | None:
        """Index of the first backward step, or None for a forward-only trace."""
        for s in self.steps:
            if s.kind == "backward":
                return s.index
        return None

    def grad(self, tensor_id: int) -> TensorRecord | None:
        """The gradient of forward tensor ``tensor_id`` (a ``role == "grad"`` record whose
        value, when kept, is ``trace.value(record.id)``), or None when it got none."""
        index = self.__dict__.get("_grad_index")
        if index is None or index[0] != len(self.tensors):
            grads = {r.grad_of: r.id for r in self.tensors if r.grad_of is not None}
            index = self.__dict__["_grad_index"] = (len(self.tensors), grads)
        rid = index[1].get(tensor_id)
        return None if rid is None else self.tensors[rid]

    def param_grad(self, name: str) -> TensorRecord | None:
        """This step's gradient of the parameter ``name`` (``"blocks.0.ff.fc1.weight"``)."""
        rid = self.meta.get("param_grads", {}).get(name)
        return None if rid is None else self.tensors[rid]

    def module_steps(self, path: str) -> list[Step]:
        """Every call of the module at ``path`` (two for a module called twice)."""
        return [s for s in self.steps if s.kind == "module" and s.module == path]

    def children_of(self, step_index: int) -> list[Step]:
        """Steps directly inside the module call ``step_index``."""
        return [s for s in self.steps if s.parent == step_index]

    # ---- views implemented in their own modules (kept apart so this file stays data)

    @cached_property
    def graph(self) -> nx.DiGraph:
        """Data-flow graph: a node per step, edges producer -> consumer by tensor id."""
        from tracing.analysis.graph import build_graph

        return build_graph(self)

    def collapsed_graph(self, depth: int) -> nx.DiGraph:
        """Block-level view: every module subtree deeper than ``depth`` as one node."""
        from tracing.analysis.graph import collapse

        return collapse(self, depth)

    def attention_maps(self) -> dict[str, torch.Tensor]:
        """Every attention-weight tensor, keyed by module path, shaped (B, H, T, T)."""
        from tracing.analysis.attention_maps import attention_maps

        return attention_maps(self)

    def save(self, path) -> None:
        """Write the trace as one safetensors file (see tracing.trace_file)."""
        from tracing.file.saving import save

        save(self, path)
