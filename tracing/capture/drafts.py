"""Drafts: the mutable steps and tensor records filled while the forward runs.

:class:`StepDraft` and :class:`TensorDraft` have the field names of ``Step`` and
``TensorRecord``; ``freeze()`` seals each into its frozen record once, when the trace
finishes (:meth:`tracing.capture.tracer.Tracer._finish`).
"""

from __future__ import annotations

from tracing.capture.op_names import device_name, dtype_name
from tracing.record import (
    Step,
    TensorRecord,
    built,
)
from tracing.stats import resolve_stats

# --------------------------------------------------------------------------- drafts


class StepDraft:
    """A step under construction: :class:`Step`'s fields, mutable (its outputs, end and
    error are known later than the rest). :meth:`seal` turns the draft itself into the
    record when the trace finishes; :meth:`freeze` makes a copy mid-run (a breakpoint's).

    No ``__slots__``: a draft has a ``__dict__`` like a ``Step``, so sealing only sets the
    last fields and the class (a record costs no second object and no copy of fields).
    """

    def __init__(
        self, kind, module, op, source, inputs, outputs, input_names, output_names, depth,
        parent, call=0,
    ):  # fmt: skip
        self.kind = kind  # "module" or "op"
        self.module = module  # dotted path it ran in
        self.op = op  # op name, or the module's type name
        self.source = source
        self.inputs = inputs  # record ids (a list while recording)
        self.outputs = outputs
        self.input_names = input_names
        self.output_names = output_names
        self.depth = depth
        self.parent = parent
        self.end = None  # module steps: the last step inside the call, set on leaving
        self.call = call
        self.error = None

    def seal(self, index: int) -> Step:
        """This draft, now the frozen :class:`Step` at ``index`` (the draft is done)."""
        self.index = index
        self.inputs = tuple(self.inputs)
        self.outputs = tuple(self.outputs)
        self.forward = None
        self.__class__ = Step  # same layout (a plain __dict__): the fields are Step's
        return self  # type: ignore[return-value]

    def freeze(self, index: int, input_names: tuple[str, ...] | None = None) -> Step:
        return built(  # Step(...), without the frozen __init__
            Step,
            {
                "index": index, "kind": self.kind, "module": self.module, "op": self.op,
                "source": self.source, "inputs": tuple(self.inputs),
                "outputs": tuple(self.outputs),
                "input_names": self.input_names if input_names is None else input_names,
                "output_names": self.output_names, "depth": self.depth,
                "parent": self.parent, "end": self.end, "call": self.call,
                "error": self.error, "forward": None,
            },
        )  # fmt: skip


class TensorDraft:
    """A tensor record under construction: the torch ``Size``, dtype and device as seen
    (named only when it becomes the record: :meth:`seal`, or :meth:`freeze` for a copy
    mid-run), the stats, the key of its kept value, the step that produced it and its role
    (``param``, ``input``, ``attention``...)."""

    def __init__(self, shape, dtype, device, producer):
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.stats = None
        self.value_key = None
        self.producer = producer
        self.role = None

    def seal(self, rid: int, dims, shape: tuple[int, ...]) -> TensorRecord:
        """This draft, now the frozen :class:`TensorRecord` ``rid`` (see
        :meth:`StepDraft.seal`)."""
        self.id = rid
        self.shape = shape
        self.dtype = dtype_name(self.dtype)
        self.device = device_name(self.device)
        self.dims = dims
        self.stats = resolve_stats(self.stats)
        self.grad_of = None
        self.__class__ = TensorRecord
        return self  # type: ignore[return-value]

    def freeze(self, rid: int, dims=None, shape: tuple[int, ...] | None = None) -> TensorRecord:
        return built(  # TensorRecord(...), without the frozen __init__
            TensorRecord,
            {
                "id": rid, "shape": tuple(self.shape) if shape is None else shape,
                "dtype": dtype_name(self.dtype), "device": device_name(self.device),
                "dims": dims, "stats": resolve_stats(self.stats),
                "value_key": self.value_key, "producer": self.producer, "role": self.role,
                "grad_of": None,
            },
        )  # fmt: skip
