"""`call[body=g](*args)`: applies a subgraph. The simplest higher-order op,
and the model for the ones that hold a body (odeint, root, while): the body
is a `Body` param (its operands all consts: it is applied once),
printed nested, verified and serialized with its node."""

from __future__ import annotations

import functools

from ..errors import ShapeError
from ..graph import (Body, Graph, Primitive, Zero, instantiate, is_differentiable, is_linear,
                     jvp_graph, lower, transpose_eval, vjp_eval)
from ..graph._autodiff import needs_ct
from ..graph._cost import Cost
from ..graph._body import applied_batch_rule, applied_body, applied_linearity_rule
from ..graph._serialize import graph_param_v1, register_v1_migration
from ..graph._sparsity import body_rule

call_p = Primitive("call", multiple_results=True, params={"body": Body})


@call_p.def_abstract_eval
def _call_shape(*in_types, body):
    if not isinstance(body, Body):
        raise ShapeError(f"`body` must be a Body, got {body!r}.", op="call")
    if tuple(in_types) != body.in_types:
        raise ShapeError(
            f"body {body.name!r} takes ({', '.join(t.str_short() for t in body.in_types)})"
            f", got ({', '.join(t.str_short() for t in in_types)}).", op="call")
    return body.out_types


@call_p.def_impl
def _call_impl(*args, body, site=None):
    return tuple(lower(body, site.held if site is not None else ())(*args))


@functools.lru_cache(maxsize=256)
def _body_of(graph: Graph) -> Body:
    # one body per graph (graphs hash by identity), so that two calls of one
    # graph hold one body, and `cse` merges them
    return applied_body(graph)


def call(graph: Graph, *args):
    """Applies `graph` to `args` (one node in the enclosing trace); returns a
    tuple of outputs."""
    return call_p.bind(*args, body=_body_of(graph))


# The JVP of a call is a call of the body's JVP graph; transposing a call
# transposes its body in place.

@call_p.def_jvp
def _call_jvp(primals, tangents, *, body):
    diff = [i for i, v in enumerate(body.inputs) if is_differentiable(v.type)]
    jg = jvp_graph(body)
    res = call_p.bind(*primals, *[instantiate(tangents[i]) for i in diff], body=applied_body(jg))
    n = len(body.outputs)
    touts = [t if is_differentiable(a.type) else Zero(a.type.update())
             for a, t in zip(body.outputs, res[n:])]
    return tuple(res[:n]), tuple(touts)


call_p.def_linearity(applied_linearity_rule("body"))


@call_p.def_transpose
def _call_transpose(cts, *args, body):
    linear = [is_linear(a) for a in args]
    values = [a for a in args if not is_linear(a)]
    lin_cts = iter(transpose_eval(body, linear, values, cts,
                                  [a for a in args if is_linear(a)]))
    return tuple(next(lin_cts) if lin else None for lin in linear)


@call_p.def_vjp
def _call_vjp(primals, outs, cts, *, body):
    # Reverse mode through the body, node by node, so that every primitive in
    # it uses its own VJP rule (an adjoint, or JAX's VJP for a wrapped JAX
    # function) rather than a transposition of its JVP.
    _, backward = vjp_eval(body, primals, [needs_ct(p) for p in primals])
    return tuple(backward(list(cts)))


call_p.def_batch(applied_batch_rule(call_p))


@call_p.def_cost
def _call_cost(node, body):
    b = body(node.params["body"])
    return Cost(b.flops, b.peak)


# Sparsity: the body's, on the operands.
call_p.def_sparsity(body_rule(lambda params: params["body"]))


register_v1_migration("call", graph_param_v1(applied_body))  # (was the param `graph`)
