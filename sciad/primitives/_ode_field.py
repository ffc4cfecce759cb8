"""The vector field of an `ode.odeint` node: its body `(*consts, t, y) ->
(dy/dt,)` (or an IMEX field's two parts, whose sum is the field) evaluated
in sciad ops, its parts alone, and the params of the derived systems (the
sensitivity and adjoint systems) that its rules build as `odeint` nodes."""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import numpy as np

from ._newton_systems import newton_jacobian
from .. import _ops as ops
from ..graph import Graph
from ..graph._body import Body, as_body, inline, permute
from ..graph._passes import dce
from ..graph._autodiff import type_of
from ._svd import svd

#: the name of the reverse pass's adjoint system's body (`_ode_adjoint`): a
#: name no Python function has, so that `_ode.judge_ode` tells a failure of
#: that solve from the forward's
ADJOINT_BODY = "adjoint system"


def field_at(graph: Graph, consts, t, y):
    """The vector field at one `(t, y)`, emitted into the current trace (the
    sum of an IMEX field's parts)."""
    return summed(inline(graph, [*consts, t, y]))


def summed(parts: list):
    """The field from the values of its parts (one, or an IMEX field's two)."""
    first, *rest = parts
    for part in rest:
        first = first + part
    return first


@functools.lru_cache(maxsize=256)
def part_of(graph: Graph, i: int) -> Graph:
    """The body of the field's part `i` alone (`graph` itself for a field of
    one part; `-1`: the stiff part, whose Jacobian the Newton systems
    hold)."""
    if len(graph.outputs) == 1:
        return graph
    return dce(permute(graph, outputs=[i % len(graph.outputs)]))


def fields_at(graph: Graph, consts, ts, ys):
    """`f(ts[i], ys[i])` for every output time, stacked."""

    return ops.stack([field_at(graph, consts, ts[i], ys[i]) for i in range(ts.shape[0])])


def augmented_pattern(params: dict, g: Graph):
    """The Newton matrices' pattern of a derived system `g` (the sensitivity
    or adjoint system) where the node's are sparse, else None."""
    if params.get("jac", "dense") != "sparse":
        return None
    return newton_jacobian(part_of(g, -1), "sparse", identity=True)[1]


def with_mass_entries(pattern, mass_pattern):
    """`pattern` (the Newton matrices' of a state of `k N` elements) with the
    entries of a mass matrix on `mass_pattern` (`N x N`) added in each of
    its `k` diagonal blocks: `M - c J` holds both."""
    import scipy.sparse as sp

    k = pattern.shape[0] // mass_pattern.shape[0]

    def csr(p):
        return sp.csr_matrix((np.ones(p.nnz, bool), p.indices, p.indptr), shape=p.shape)

    both = (csr(pattern) + sp.kron(sp.eye(k, dtype=bool), csr(mass_pattern))).astype(bool)
    both = sp.csr_matrix(both)
    both.sum_duplicates()
    both.sort_indices()
    return type(pattern)(both.shape, both.indptr, both.indices)


def field_body(graph: Graph) -> Body:
    """A vector field's graph `(*consts, t, y) -> (f,)` (or its parts) as
    an `odeint` node's body: `t` and `y` are its per-step inputs."""
    return as_body(graph, len(graph.inputs) - 2)


def derived_params(params: dict, **changes) -> dict:
    """The params of a derived `odeint` node (the sensitivity or adjoint
    system): `params` with `changes` (a new `body` as a `Body`); a None
    value means the param's default."""
    out = dict(params)
    out.update(changes)
    if "body" in changes:
        out["body"] = field_body(changes["body"])
    return {k: v for k, v in out.items() if v is not None}


# ---------------------------------------------------------------------------
# the mass matrix of `M dy/dt = f`, in sciad ops (the derivative rules')


class MassOps(NamedTuple):
    """The mass matrix `I_k (x) M` of an `n`-element state, in sciad ops."""

    apply: Callable     # v -> M v
    apply_T: Callable   # v -> M^T v
    start: Callable     # v -> P v (P: the first step's dy/dt = P f, `_steps.Mass`)
    start_T: Callable   # v -> P^T v
    scale: Callable     # c -> the rows' scaling (1 / c on the algebraic ones), or None


def _identity(v):
    return v


def _no_mass() -> MassOps:
    return MassOps(_identity, _identity, _identity, _identity, lambda c: None)


def _row_scaling(algebraic, k: int) -> Callable:
    """`c -> ` the rows' scaling of `I_k (x) M - c J`: `1 / c` on the
    `algebraic` rows of `M` (those without an entry), 1 elsewhere."""
    def scale(c):
        return ops.concatenate([ops.where(algebraic, 1.0 / c, 1.0)] * k)

    return scale


def _blocks(fn, v, k: int, size: int):
    """`fn` on each of `v`'s `k` blocks of `size`, concatenated."""
    return ops.reshape(fn(ops.reshape(v, (k, size))), (k * size,))


def _dense_mass(M, n: int, dtype) -> MassOps:
    size = type_of(M).shape[0]
    k = n // size
    # P^T = pinv(I_k (x) M)^T block by block: jax.numpy.linalg.pinv's
    # cutoff, 10 max(rows, cols) eps times the largest singular value (those
    # of I_k (x) M are M's)
    s, u, vh = svd(M)
    keep = s > 10.0 * n * float(np.finfo(dtype).eps) * ops.max(s)
    s_inv = ops.where(keep, 1.0 / ops.where(keep, s, 1.0), 0.0)
    algebraic = ops.sum(ops.abs(M), axis=1) == 0
    return MassOps(lambda v: _blocks(lambda b: ops.matmul(b, ops.transpose(M)), v, k, size),
                   lambda v: _blocks(lambda b: ops.matmul(b, M), v, k, size),
                   lambda v: _blocks(lambda b: ops.matmul(
                       ops.matmul(b, u) * s_inv, vh), v, k, size),
                   lambda v: _blocks(lambda b: ops.matmul(
                       ops.matmul(b, ops.transpose(vh)) * s_inv, ops.transpose(u)), v, k, size),
                   _row_scaling(algebraic, k))


def _sparse_mass(values, pattern, n: int) -> MassOps:
    size = pattern.shape[0]
    k = n // size
    rows, cols = np.asarray(pattern.rows), np.asarray(pattern.indices)
    zeros = ops.zeros((size,), type_of(values).dtype)

    def apply(v, r, c):
        return _blocks(lambda b: ops.stack([zeros.at[r].add(values * b[j][c])
                                            for j in range(k)]), v, k, size)

    # the diagonal (`_steps.Mass.derivative`'s f / diag(M), 0 where it is 0)
    on_diag = rows == cols
    diag = zeros.at[rows[on_diag]].add(values[np.flatnonzero(on_diag)])
    inv = ops.concatenate([ops.where(diag != 0, 1.0 / ops.where(diag != 0, diag, 1.0),
                                     0.0)] * k)
    algebraic = zeros.at[rows].add(ops.abs(values)) == 0
    return MassOps(lambda v: apply(v, rows, cols), lambda v: apply(v, cols, rows),
                   lambda v: inv * v, lambda v: inv * v, _row_scaling(algebraic, k))


def mass_in_ops(consts, mass: int | None, mass_pattern, n: int, dtype) -> MassOps:
    """The mass matrix of an `odeint` node whose params `mass` (its index
    among the `consts`) and `mass_pattern` are these, for its `n`-element
    state, in sciad ops (the identity where it has none)."""
    if mass is None:
        return _no_mass()
    if mass_pattern is not None:
        return _sparse_mass(consts[mass], mass_pattern, n)
    return _dense_mass(consts[mass], n, dtype)
