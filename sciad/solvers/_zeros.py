"""Large zero arrays that cost the rows written, on the CPU.

A stiff loop's record (`ode._steps.blank`) holds `max_steps + 1` states, of
which a few hundred are written: 67 MB at the default 4,096 steps and 2,048
states, and zeroing it (XLA's memset, each page faulted in) took 14 ms of a
gradient that the rows written make in under 1 ms. `zeros(shape, dtype)` is
that array from `csrc/zeros.cc`, an XLA FFI handler built on first use
(`sciad.solvers._build`): the whole pages of its buffer handed back to the
kernel, which reads them as zeros until first written. The same zeros
`jnp.zeros` makes, for every reader; where the array is small, the backend
is not the CPU or the extension cannot be built, it is `jnp.zeros`.

```python
states = zeros((max_steps + 1, n), jnp.float64)   # a loop writes rows of it
```
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from . import _build

SOURCE = Path(__file__).parent / "csrc" / "zeros.cc"
#: below this many bytes, `jnp.zeros` (the pages a memset touches are few)
LARGE = 1 << 20


def _setup(lib) -> None:
    jax.ffi.register_ffi_target("sciad_zeros", jax.ffi.pycapsule(lib.sciad_zeros),
                                platform="cpu")


_LIBRARY = _build.Library(SOURCE, "zeros", "libsciad_zeros.so", "sciad's lazy zeros", _setup)


def zeros(shape, dtype) -> jax.Array:
    """`jnp.zeros(shape, dtype)`, its pages untouched until written where it
    is at least `LARGE` bytes on the CPU (see the module docstring)."""
    shape, dtype = tuple(int(s) for s in shape), np.dtype(dtype)
    if int(np.prod(shape)) * dtype.itemsize < LARGE or not _build.on_cpu() \
            or _LIBRARY.get() is None:
        return jnp.zeros(shape, dtype)
    return jax.ffi.ffi_call("sciad_zeros", jax.ShapeDtypeStruct(shape, dtype))()
