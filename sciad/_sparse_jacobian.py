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
    """The structural sparsity pattern of `f`'s Jacobian, detected from its graph.

    `f` is traced once and its graph interpreted with each primitive's
    sparsity rule: every element of every value carries the set of input
    elements it depends on. The pattern is global (it holds for every value
    of the input) and sound (every entry that can be nonzero is in it); a
    constant matrix's zeros (a stencil) are kept. A primitive without a rule
    is taken as dense in its operands, with a `SparsityWarning` naming it.

    **Arguments:**

    - `f`: a function of arrays returning one array.
    - `*args`: example arguments (only their shapes and dtypes matter, and
      the values of constants in `f`).
    - `argnums`: the argument to differentiate (an int).

    **Returns:**

    A SciPy CSR matrix of booleans of shape `(f(x).size, x.size)`.
    """
    _, _, graph, captured = _setup(f, args, argnums, "sparse.jacobian_sparsity")
    return graph_sparsity(graph, [True] + [False] * len(captured))


def jacobian(f: Callable, argnums: int = 0, *, mode: str = "auto"):
    """The Jacobian of `f` as a sparse matrix, by colored forward (or reverse)
    mode.

    The pattern is detected from `f`'s graph (`jacobian_sparsity`) and its
    columns colored: columns that share no row get one color, and one JVP
    per color, seeded with the sum of its columns' unit vectors, gives all
    of them. The JVPs are batched into one graph of the size of one JVP. A
    5-point stencil takes 5 to 7 products, whatever the grid's size, where a
    dense Jacobian takes one per unknown. With fewer outputs than inputs
    the rows may color better, and `mode="auto"` then uses VJPs.

    **Arguments:**

    - `f`: a function of arrays returning one array.
    - `argnums`: the argument to differentiate (an int).
    - `mode`: `"auto"`, `"forward"` (JVPs per column color) or `"reverse"`
      (VJPs per row color).

    **Returns:**

    A function of `f`'s arguments returning a sciad sparse matrix of shape
    `(f(x).size, x.size)` (a traced one inside a trace). Its values are
    differentiable like any sciad value.
    """
    def inline(*args):
        x, tx, graph, captured = _setup(f, args, argnums, "sparse.jacobian")
        pattern = graph_sparsity(graph, [True] + [False] * len(captured))
        return emit(graph, [x] + list(captured), 0, structure_of(pattern, mode))

    return _Transformed(inline, f, "sparse.jacobian")
