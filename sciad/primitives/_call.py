"""`call[graph=g](*args)`: applies a subgraph. The simplest higher-order op,
and the model for the ones that hold a body (odeint, root, while): the body
is a `Graph` param, printed nested, verified and serialized with its node."""

from __future__ import annotations

from ..errors import ShapeError
from ..graph import Graph, Primitive, lower

call_p = Primitive("call", multiple_results=True)


@call_p.def_abstract_eval
def _call_shape(*in_types, graph):
    if not isinstance(graph, Graph):
        raise ShapeError(f"`graph` must be a Graph, got {graph!r}.", op="call")
    if tuple(in_types) != graph.in_types:
        raise ShapeError(
            f"graph {graph.name!r} takes ({', '.join(t.str_short() for t in graph.in_types)})"
            f", got ({', '.join(t.str_short() for t in in_types)}).", op="call")
    return graph.out_types


@call_p.def_impl
def _call_impl(*args, graph):
    return tuple(lower(graph)(*args))


def call(graph: Graph, *args):
    """Applies `graph` to `args` (one node in the enclosing trace); returns a
    tuple of outputs."""
    return call_p.bind(*args, graph=graph)
