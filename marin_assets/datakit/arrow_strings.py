"""pyarrow string Arrays built straight from buffers, without pandas.

pa.array() on Python values imports pandas when it is installed (~1-2 s per process on a
busy machine), which a normalize or dedup step never needs; these cost one encode per value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast


def string_array(values: Sequence[str] | Sequence[bytes], large: bool = False, utf8: bool = False):
    """A pyarrow (large_)string Array of `values` (str, or with `utf8` their valid UTF-8
    bytes), built from buffers."""
    import numpy as np
    import pyarrow as pa

    encoded = cast(Sequence[bytes], values) if utf8 else [v.encode("utf-8") for v in cast(Sequence[str], values)]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:])
    if not large and offsets[-1] >= 2**31:
        raise ValueError(f"{offsets[-1]} bytes do not fit a string array; use large=True")
    kind = pa.large_string() if large else pa.string()
    offsets = offsets if large else offsets.astype(np.int32)
    return pa.Array.from_buffers(kind, len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])


def repeated_string(value: str, n: int):
    """A pyarrow string Array holding `value` n times (pandas-free, see string_array)."""
    import numpy as np
    import pyarrow as pa

    data = value.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int64) * len(data)
    if offsets[-1] >= 2**31:
        raise ValueError(f"{n} x {len(data)} bytes do not fit a string array")
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data * n)])
