"""The vector field of an `ode.odeint` node: its body `(*consts, t, y) ->
(dy/dt,)` (or an IMEX field's two parts, whose sum is the field) evaluated
in sciad ops, its parts alone, and the params of the derived systems (the
sensitivity and adjoint systems) that its rules build as `odeint` nodes."""

from __future__ import annotations

import functools

import numpy as np

from ._newton_systems import newton_jacobian
from .. import _ops as ops
from ..graph import Graph
from ..graph._body import Body, as_body, inline, permute
from ..graph._passes import dce


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
