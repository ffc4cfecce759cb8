"""Sparse Jacobians: the pattern detected from the graph, the values by
colored JVPs (or VJPs).

`jacobian_sparsity(f, x)` interprets `f`'s graph with the primitives'
sparsity rules (`sciad.graph._sparsity`). `jacobian(f)(x)` colors the
pattern's columns (Curtis-Powell-Reid: columns sharing no row share a color)
and evaluates one JVP per color, batched into one graph of the size of one
JVP, then reads each entry from its color's product. Where the rows color
with fewer colors (a function with fewer outputs than inputs), it uses one
VJP per row color instead. The pattern and the coloring are computed once per
signature, when the function is traced. The machinery (`emit`,
`structure_of`) lives in `sciad.primitives._jacobian`, where the Newton
solves of `sd.optimize.root` use it on their residual's graph.
"""

from __future__ import annotations

from typing import Callable

import scipy.sparse as sp

from ._traceback import api_boundary
from ._transforms import _Transformed, _jacobian_setup
from .errors import ShapeError
from .graph import Graph, TensorType
from .graph._sparsity import graph_sparsity
from .primitives._jacobian import emit, structure_of


def _single_output(graph: Graph, op: str) -> TensorType:
    if len(graph.outputs) != 1 or not isinstance(graph.outputs[0].type, TensorType):
        raise ShapeError(f"`f` must return one array, got "
                         f"{', '.join(a.type.str_short() for a in graph.outputs) or 'nothing'}.",
                         op=op)
    return graph.outputs[0].type


def _setup(f: Callable, args: tuple, argnums: int, op: str):
    x, tx, graph, _, captured = _jacobian_setup(f, argnums, args, op)
    _single_output(graph, op)
    return x, tx, graph, captured


@api_boundary
def jacobian_sparsity(f: Callable, *args, argnums: int = 0) -> sp.csr_matrix:
    """The implementation of `sciad.sparse.jacobian_sparsity` (its docstring is there)."""
    _, _, graph, captured = _setup(f, args, argnums, "sparse.jacobian_sparsity")
    return graph_sparsity(graph, [True] + [False] * len(captured))


def jacobian(f: Callable, argnums: int = 0, *, mode: str = "auto"):
    """The implementation of `sciad.sparse.jacobian` (its docstring is there)."""
    def inline(*args):
        x, tx, graph, captured = _setup(f, args, argnums, "sparse.jacobian")
        pattern = graph_sparsity(graph, [True] + [False] * len(captured))
        return emit(graph, [x] + list(captured), 0, structure_of(pattern, mode))

    return _Transformed(inline, f, "sparse.jacobian")
