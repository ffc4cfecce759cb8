"""`call[graph=g](*args)`: applies a subgraph. The simplest higher-order op,
and the model for the ones that hold a body (odeint, root, while): the body
is a `Graph` param, printed nested, verified and serialized with its node."""

from __future__ import annotations

from ..errors import ShapeError
from ..graph import (Graph, Primitive, Zero, instantiate, is_differentiable, is_linear,
                     jvp_graph, lower, transpose_eval, vjp_eval)
from ..graph._autodiff import graph_linear_outputs, needs_ct
from ..graph._batch import batch_body, batch_size_of, front_where
from ..graph._sparsity import body_rule

call_p = Primitive("call", multiple_results=True, params={"graph": Graph})


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


# The JVP of a call is a call of the body's JVP graph; transposing a call
# transposes its body in place.

@call_p.def_jvp
def _call_jvp(primals, tangents, *, graph):
    diff = [i for i, v in enumerate(graph.inputs) if is_differentiable(v.type)]
    jg = jvp_graph(graph)
    res = call_p.bind(*primals, *[instantiate(tangents[i]) for i in diff], graph=jg)
    n = len(graph.outputs)
    touts = [t if is_differentiable(a.type) else Zero(a.type.update())
             for a, t in zip(graph.outputs, res[n:])]
    return tuple(res[:n]), tuple(touts)


@call_p.def_linearity
def _call_linearity(linear, *, graph):
    return graph_linear_outputs(graph, linear)


@call_p.def_transpose
def _call_transpose(cts, *args, graph):
    linear = [is_linear(a) for a in args]
    values = [a for a in args if not is_linear(a)]
    lin_cts = iter(transpose_eval(graph, linear, values, cts,
                                  [a for a in args if is_linear(a)]))
    return tuple(next(lin_cts) if lin else None for lin in linear)


@call_p.def_vjp
def _call_vjp(primals, outs, cts, *, graph):
    # Reverse mode through the body, node by node, so that every primitive in
    # it uses its own VJP rule (an adjoint, or JAX's VJP for a wrapped JAX
    # function) rather than a transposition of its JVP.
    _, backward = vjp_eval(graph, primals, [needs_ct(p) for p in primals])
    return tuple(backward(list(cts)))


@call_p.def_batch
def _call_batch(args, dims, *, graph):
    size = batch_size_of(args, dims)
    flags = [d is not None for d in dims]
    g, out_b = batch_body(graph, flags, size)
    res = call_p.bind(*front_where(args, dims, flags, size), graph=g)
    return list(res), [0 if b else None for b in out_b]


@call_p.def_cost
def _call_cost(node, body):
    from ..graph._cost import Cost

    b = body(node.params["graph"])
    return Cost(b.flops, b.peak)


# Sparsity: the body's, on the operands.
call_p.def_sparsity(body_rule(lambda params: params["graph"]))
