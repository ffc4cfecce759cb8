"""The array constants of a lowered program, wherever they are: printed in
its text (`stablehlo.constant`) or passed to the executable as buffers
(JAX's hoisting of large constants, which importing sciad turns on:
`sciad.config.constants_policy`). Used by the tests that count how often an
index array enters a program."""

from __future__ import annotations

import re

import numpy as np


def array_constants(lowered, min_size: int = 100) -> list[tuple[str, tuple, bytes]]:
    """`(dtype, shape, bytes)` of every array constant of over `min_size`
    entries of `lowered` (a `jax.stages.Lowered`): one entry per buffer the
    executable is passed (two equal buffers are two entries), and one per
    distinct constant in the text (which prints a small constant at each
    use; the compiler merges equal ones)."""
    text = lowered.as_text()
    out = []
    for value, shape, dtype in sorted(set(re.findall(
            r'stablehlo.constant dense<"0x([0-9A-F]+)"> : tensor<([0-9x]+)x([a-z0-9]+)>', text))):
        dims = tuple(int(d) for d in shape.split("x"))
        if np.prod(dims) > min_size:
            out.append((dtype, dims, bytes.fromhex(value)))
    names = {"int32": "i32", "int64": "i64", "float64": "f64", "float32": "f32"}
    for c in getattr(lowered._lowering, "const_args", ()):  # (hoisted: jax.Arrays)
        a = np.asarray(c)
        if a.size > min_size:
            out.append((names.get(a.dtype.name, a.dtype.name), a.shape, a.tobytes()))
    return out
