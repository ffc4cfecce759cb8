"""`SparseNewtonSolver`: the Newton systems of diffrax's implicit solvers
solved by SuperLU on the host.

diffrax's implicit Runge-Kutta methods (Kvaerno3/4/5, ImplicitEuler) find
each stage with `diffrax.VeryChord`: once per step it linearises the stage
relation (`lx.JacobianLinearOperator`, `lx.linearise`) and calls the linear
solver's `init(operator)`; every Newton iteration of every stage of that step
then calls `compute(state, vector)`. The matrix is `I - h gamma df/dy`
(up to diffrax's scaling), whose pattern, that of `df/dy` plus the diagonal,
sciad detects from the vector field's graph.

- `init`: the matrix's values on the pattern from one matrix-vector product
  per color of the pattern's columns (Curtis-Powell-Reid: columns sharing no
  row share a color; `vmap`ped over the seeds, a handful of JVPs instead of
  `n`), read back entry by entry; then one host call factors them with
  SuperLU (`sciad.solvers._sparse_direct`) and returns a handle (an int32)
  to the factor, kept in a host store of this module's own. The state is
  `(values, handle)`.
- `compute`: one host call, a pair of triangular solves with the handle's
  factor (transposed or conjugated as lineax asks, from the same factor).

The store is a bounded cache, as `_sparse_direct`'s is: every step makes a
new factor and the oldest beyond `_sparse_direct.MAX_KEPT` are released
(never those just made, so a `vmap`'s batch of factors all stay), so
thousands of steps hold a few factors. Every solve also receives the values,
so a solve whose factor was pushed out (by concurrent runs of a program, or
a program run twice by XLA) factors them again: the cache never changes a
result. Handles are never shared between batch elements or calls.

A matrix that is exactly the identity (diffrax linearises a dummy relation
with a zero diagonal at the start of each step) is not factored: its handle
is `IDENTITY` and its solves copy the vector. A singular or non-finite matrix
gives a NaN solution, which lineax reports as a failed solve and diffrax
answers with a smaller step.
"""

from __future__ import annotations

import functools
from typing import Any

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import lineax as lx
import lineax.internal as lxi
import numpy as np
import scipy.sparse as sp

from . import _sparse_direct
from ._host import host_call

#: the handle of an identity matrix (no factor: solves copy the vector)
IDENTITY = -1

# this module's factors: not mixed with the linear-algebra nodes' kept ones,
# which thousands of time steps would otherwise push out
_store = _sparse_direct._Store()


def held() -> int:
    """How many factorizations the ODE solver's store holds now (for tests:
    bounded however many steps were taken)."""
    return len(_store)


def _with_diagonal(pattern):
    """`pattern` with its diagonal added where it lacks entries (a Newton
    matrix `I - h gamma J` has them whatever `J`'s pattern is)."""
    from .._sparse_jacobian import _pattern

    if np.all(pattern.diagonal_positions() >= 0):
        return pattern
    n = pattern.shape[0]
    p = sp.csr_matrix((np.ones(pattern.nnz, bool), pattern.indices, pattern.indptr),
                      shape=pattern.shape)
    return _pattern(p + sp.eye(n, dtype=bool, format="csr"))


@functools.lru_cache(maxsize=32)
def _structure(pattern):
    """`(seeds, color of each entry's column, identity values)` of `pattern`,
    computed once per pattern."""
    from ..graph._sparsity import color_seeds, coloring

    colors = coloring(pattern)
    seeds = color_seeds(colors, pattern.shape[1])
    where = np.asarray(colors[pattern.indices], np.int64)
    eye = np.zeros(pattern.nnz)
    eye[pattern.diagonal_positions()] = 1.0
    for a in (seeds, where, eye):
        a.setflags(write=False)
    return seeds, where, eye


def _factor(pattern, values):
    """The handles of the factors of the matrices with `values` on `pattern`
    (leading batch axes allowed), factored on the host and stored."""
    _, _, eye = _structure(pattern)

    def host(d):
        batch = d.shape[:-1]
        flat = d.reshape((-1, d.shape[-1]))
        ident = [bool(np.array_equal(row, eye)) for row in flat]
        rows = [row for row, i in zip(flat, ident) if not i]
        made = _sparse_direct._Factored.make_many(pattern, rows) if rows else []
        handles = np.full(len(flat), IDENTITY, np.int32)
        new = [_store.new_handle() for _ in made]
        handles[[k for k, i in enumerate(ident) if not i]] = new
        if made:
            _store.put(new, made, None)  # uncounted: the oldest pushed out
        return (handles.reshape(batch),)

    (h,) = host_call(host, (jax.ShapeDtypeStruct(values.shape[:-1], jnp.int32),), values)
    return h


def _solve_one(pattern, handle: int, d: np.ndarray, b: np.ndarray, transpose: bool,
               conj: bool) -> np.ndarray:
    """`op(A) x = b` with `handle`'s factor of `A` (values `d`); factored
    again if the store let it go. `conj`: with `conj(A)`, by conjugating
    `b` and the solution."""
    if handle == IDENTITY:
        return b.copy()
    got = _store.get(handle)
    if got is None:  # pushed out: factor again, under the same handle
        f = _sparse_direct._Factored.make(pattern, d)
        _store.put([handle], [f], None)
        lu = f.lu
    else:
        lu = got[1]
    if lu is None:  # exactly singular, or not finite
        return np.full(b.shape, np.nan, b.dtype)
    if conj:
        b = np.conj(b)
    x = _sparse_direct._lu_solve(lu, b, transpose)
    return np.conj(x) if conj else x


def _solve(pattern, handle, values, b, transpose: bool, conj: bool):
    """`op(A) x = b` on the host (leading batch axes allowed: a `vmap`)."""
    def host(h, d, bb):
        if h.ndim == 0:  # one solve (no vmap)
            return (_solve_one(pattern, int(h), d, bb, transpose, conj),)
        batch, examples = _sparse_direct.each_example(h, d, bb)
        out = np.stack([_solve_one(pattern, hi, di, bi, transpose, conj)
                        for hi, di, bi in examples])
        return (out.reshape(batch + bb.shape[-1:]),)

    (x,) = host_call(host, (jax.ShapeDtypeStruct(b.shape, b.dtype),), handle, values, b)
    return x


class SparseNewtonSolver(lx.AbstractLinearSolver):
    """A lineax solver for square operators whose matrix has the sparsity
    `pattern` (a `sciad.graph._types.Pattern`; the diagonal is added if it
    lacks it): values by colored matrix-vector products, SuperLU on the host
    (see the module docstring). For `diffrax.VeryChord(linear_solver=...)`.

    Entries of the operator outside `pattern` are silently dropped (its
    colored products add them to other entries): the pattern must hold the
    whole structure."""

    pattern: Any = eqx.field(static=True)

    def __init__(self, pattern):
        if pattern.shape[0] != pattern.shape[1]:
            raise ValueError(f"SparseNewtonSolver needs a square pattern, got {pattern!r}.")
        self.pattern = _with_diagonal(pattern)

    def init(self, operator: lx.AbstractLinearOperator, options: dict[str, Any]):
        del options
        n = self.pattern.shape[0]
        if operator.in_size() != n or operator.out_size() != n:
            raise ValueError(f"SparseNewtonSolver: the operator is {operator.out_size()} x "
                             f"{operator.in_size()}, its pattern {self.pattern!r}.")
        packed = lxi.pack_structures(operator)
        seeds, where, _ = _structure(self.pattern)
        dtype = jnp.result_type(*[s.dtype for s in jax.tree_util.tree_leaves(
            operator.in_structure())])

        def product(seed):  # the operator on one color's seed, flat
            out = operator.mv(lxi.unravel_solution(seed, packed))
            return lxi.ravel_vector(out, packed)

        products = jax.vmap(product)(jnp.asarray(seeds, dtype))  # (n_colors, n)
        values = products[where, self.pattern.rows]  # entry (i, j): color(j)'s row i
        handle = _factor(self.pattern, values)
        return values, handle, packed, eqxi.Static((False, False))

    def compute(self, state, vector, options: dict[str, Any]):
        del options
        values, handle, packed, flags = state
        transpose, conj = flags.value
        b = lxi.ravel_vector(vector, packed)
        x = _solve(self.pattern, handle, values, b.astype(values.dtype), transpose, conj)
        return lxi.unravel_solution(x, packed), lx.RESULTS.successful, {}

    def transpose(self, state, options: dict[str, Any]):
        values, handle, packed, flags = state
        transpose, conj = flags.value
        return (values, handle, lxi.transpose_packed_structures(packed),
                eqxi.Static((not transpose, conj))), {}

    def conj(self, state, options: dict[str, Any]):
        values, handle, packed, flags = state
        transpose, conj = flags.value
        # (values stay A's: the solve conjugates around A's factor)
        return (values, handle, packed, eqxi.Static((transpose, not conj))), {}

    def assume_full_rank(self) -> bool:
        return True
