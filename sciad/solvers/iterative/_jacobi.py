"""`"jacobi"`: the diagonal (Jacobi) preconditioner `M = diag(A)`, set up in
the program from the matrix's values, dense or sparse."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ._iterative import AbstractPreconditioner, missing_diagonal


class Jacobi(AbstractPreconditioner):
    """`M^-1 v = v / diag(A)` (the same for the transposed solve); symmetric
    positive definite where the diagonal is positive, as an spd matrix's is."""

    name = "jacobi"
    matrices = frozenset({"dense", "sparse"})
    shardable = True  # (each device its rows' diagonal)

    def rejects(self, *, matrix: str, pattern=None, shown: str = ""):
        if matrix != "sparse":
            return None
        return missing_diagonal(pattern, "the Jacobi preconditioner", shown)

    def setup(self, a, *, pattern=None, after=None):
        diag = a[pattern.diagonal_positions()] if pattern is not None else jnp.diagonal(a)
        return (1.0 / diag,)

    def apply(self, state, a, v, *, pattern=None, transpose: bool = False):
        return state[0] * v

    def setup_bytes(self, n: int, pattern, dtype) -> int:
        return n * np.dtype(dtype).itemsize

    def apply_flops(self, n: int, pattern) -> float:
        return float(n)
