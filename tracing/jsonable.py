"""Plain JSON from whatever a trace's metadata or settings hold.

>>> to_jsonable({"t": 0.5, "bad": float("nan"), 3: (1, 2), "dev": object})
{'t': 0.5, 'bad': None, '3': [1, 2], 'dev': "<class 'object'>"}
"""

from __future__ import annotations

import math
from typing import Any


def to_jsonable(value: Any) -> Any:
    """``value`` as JSON types: tuples become lists, keys strings, non-finite floats None,
    anything else its ``str``."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [to_jsonable(x) for x in value]
    if isinstance(value, dict):
        return {str(k): to_jsonable(x) for k, x in value.items()}
    return str(value)


__all__ = ["to_jsonable"]
