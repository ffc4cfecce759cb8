"""Read-only host arrays that a CPU device array can share instead of copying.

XLA:CPU wraps a host buffer as a device buffer without a copy when it is
aligned to 64 bytes (`jax.device_put(a, device, may_alias=True)`); NumPy's
own large allocations are aligned to 16 only, so every index array sciad
handed to a program was held twice on the CPU: once as NumPy (a pattern's
transpose, an assembly's element map) and once as the device constant
(`sciad.solvers._indices.index_array`). At a million HEX8 nodes those
pairs were 0.4 GB of the peak.

- `aligned(values, dtype)`: `values` converted to `dtype` in one copy into a
  new 64-byte aligned, read-only array.
- `shareable(a)`: whether a device array on the CPU may wrap `a` itself (it
  is aligned, C-contiguous and read-only, so neither side can change what
  the other reads).

```python
perm = aligned(np.argsort(keys), np.int32)           # kept by its owner
x = jax.device_put(perm.reshape(-1, 1), cpu, may_alias=True)   # no copy
```
"""

from __future__ import annotations

import numpy as np

#: the alignment (bytes) XLA:CPU asks of a host buffer it wraps without a copy
ALIGNMENT = 64


def aligned(values, dtype) -> np.ndarray:
    """`np.asarray(values).astype(dtype)` (raveled), written once into a new
    `ALIGNMENT`-byte aligned buffer, returned read-only."""
    values = np.asarray(values).ravel()
    dtype = np.dtype(dtype)
    raw = np.empty(values.size * dtype.itemsize + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    out = raw[start:start + values.size * dtype.itemsize].view(dtype)
    np.copyto(out, values, casting="unsafe")
    out.setflags(write=False)
    raw.setflags(write=False)
    return out


def shareable(a) -> bool:
    """Whether `a` is a C-contiguous NumPy array at an `ALIGNMENT`-byte
    boundary, read-only together with every array it views (a device array
    may wrap it: no one can write what either side reads)."""
    if not (isinstance(a, np.ndarray) and a.flags.c_contiguous
            and a.ctypes.data % ALIGNMENT == 0):
        return False
    while isinstance(a, np.ndarray):
        if a.flags.writeable:
            return False
        a = a.base
    return a is None
