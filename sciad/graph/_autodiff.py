"""Automatic differentiation on the graph.

Forward mode (`jvp_eval`, `jvp_graph`): every value `v` becomes `(v, dv)`
and every node emits its primitive's JVP rule, written with sciad ops, so the
tangent computation is an ordinary sciad graph.

Reverse mode (`vjp_eval`, `vjp_graph`): the forward nodes are emitted, then
the nodes are walked in reverse topological order. A node whose primitive
has a VJP rule emits it; any other node's VJP is derived from its JVP: the
JVP rule, traced with symbolic tangents, is a small graph that is linear in
them; its nonlinear part is evaluated on the primal values and its linear
part is transposed node by node with the primitives' transpose rules
(`transpose_eval`). Adjoints of a value used several times are accumulated
with explicit `add_any` nodes.

Conventions:

- Only float and complex values carry tangents and cotangents. Integer and
  boolean values never do; their tangents are symbolic `Zero`s.
- A `Zero(type)` is a symbolic zero: rules receive it and may return it;
  nothing is materialized for it unless a rule must (`instantiate`).
- Nodes emitted on behalf of a node (its re-emission, its rules' nodes) carry
  that node's `source` (`emitting_for`), so a derivative node, and an error
  raised when it runs, names the user's line that created the node it comes
  from, not the line that called `sd.grad`.
- Complex numbers follow JAX: the transpose of a C-linear map is its plain
  (unconjugated) transpose, so `grad` of a real function of `z` is the
  conjugate of the Wirtinger-style gradient (`grad(|z|**2)(z) = 2 conj(z)`),
  and the dot-product identity is `Re sum(w * J v) = Re sum(J^T w * v)`.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import DTypeError, MissingRuleError, RuleError, ShapeError
from ._core import Graph, Literal, Node, Primitive, Var
from ._interpret import Interpreter
from ._passes import dce, merge_duplicates
from ._trace import Tracer, emitting_for, trace_flat
from ._types import AbstractType, BatchedType, SparseArray, SparseType, TensorType


# ---------------------------------------------------------------------------
# Symbolic zeros, linear placeholders and the two primitives transforms need


class Zero:
    """A symbolic zero tangent or cotangent of type `type`."""

    __slots__ = ("type",)

    def __init__(self, type: AbstractType):
        self.type = type

    def __repr__(self) -> str:
        return f"Zero({self.type.str_short()})"


class UndefinedPrimal:
    """Stands for a linear input in a transpose rule: the value is unknown,
    only its type is. `is_linear(x)` tells such inputs apart.

    `value_at_zero(x)` gives the value it takes where the linear inputs of
    the map being transposed are zero (`at_zero` computes it, emitting the
    nodes that do; without it, zeros): a rule that transposes through its
    VJP evaluates that at this point."""

    __slots__ = ("type", "at_zero")

    def __init__(self, type: AbstractType, at_zero: Callable[[], Any] | None = None):
        self.type = type
        self.at_zero = at_zero

    @property
    def shape(self):
        return self.type.shape

    @property
    def dtype(self):
        return self.type.dtype

    def __repr__(self) -> str:
        return f"UndefinedPrimal({self.type.str_short()})"


def literal_operand(lit: Literal):
    """A constant as an operand for re-binding: its array, or a `SparseArray`
    (a sparse constant keeps its type)."""
    if isinstance(lit.type, SparseType):
        return SparseArray(lit.value, lit.type)
    return lit.value


def is_zero(x) -> bool:
    """Whether `x` is a symbolic zero tangent or cotangent (`Zero`), which
    rules receive for an operand without one and may return."""
    return isinstance(x, Zero)


def is_linear(x) -> bool:
    """Whether `x`, an operand a transpose rule receives, is one of the
    linear inputs to transpose (an `UndefinedPrimal`), not a fixed value."""
    return isinstance(x, UndefinedPrimal)


#: nodes whose output is zero wherever their one operand is (a batch's
#: broadcast of an instantiated zero, its reshapes and casts)
_ZERO_PRESERVING = ("broadcast_to", "reshape", "transpose", "convert")


def known_zero(x) -> bool:
    """Whether `x` is zero by construction: a constant of zeros, or a traced
    value made by a node without operands (`zeros`, `full`) whose value is
    zeros (a JVP's instantiated symbolic zero), or by a broadcast, reshape,
    transpose or cast of one (as batching makes of it)."""
    if isinstance(x, Tracer):
        return _zero_var(x._builder.nodes, x._var)
    return not isinstance(x, (UndefinedPrimal, Zero, SparseArray)) and bool(
        np.all(np.asarray(x) == 0))


def _zero_var(nodes, var, depth: int = 0) -> bool:
    producer = next((n for n in reversed(nodes) if var in n.outputs), None)
    if producer is None or depth > 16:
        return False
    if producer.primitive.name in _ZERO_PRESERVING and len(producer.inputs) == 1:
        (src,) = producer.inputs
        if isinstance(src, Literal):
            return bool(np.all(src.value == 0))
        return isinstance(src, Var) and _zero_var(nodes, src, depth + 1)
    if producer.inputs or producer.primitive.impl_rule is None:
        return False
    with jax.ensure_compile_time_eval():
        out = producer.primitive.impl_rule(**producer.params)
    out = out if producer.primitive.multiple_results else (out,)
    return bool(np.all(np.asarray(out[producer.outputs.index(var)]) == 0))


def value_at_zero(x):
    """A transpose rule's operand where the linear inputs of the map are
    zero: `x` itself if it is not linear, else the value its `at_zero`
    emits (zeros for a linear input of the map)."""
    if not is_linear(x):
        return x
    return x.at_zero() if x.at_zero is not None else zeros(x.type)


def type_of(x) -> AbstractType:
    t = getattr(x, "type", None)
    if isinstance(t, AbstractType):
        return t
    return TensorType.of(x)


def is_differentiable(t: AbstractType) -> bool:
    """Whether values of type `t` carry tangents: float and complex arrays and
    sparse matrices (whose tangents are sparse on the same pattern), and
    batches of sparse matrices."""
    while isinstance(t, BatchedType):
        t = t.inner
    return isinstance(t, (TensorType, SparseType)) and t.dtype.kind in "fc"


def _tangent_type(t: AbstractType) -> AbstractType:
    return t.update() if is_differentiable(t) or isinstance(t, (TensorType, SparseType)) else t


add_any_p = Primitive("add_any", params={})
"""The primitive that adds two tangents or cotangents (`add_tangents`), which
the transforms emit where a value reaches a derivative by two paths."""


@add_any_p.def_abstract_eval
def _add_any_shape(x, y):
    if x.update() != y.update():

        raise ShapeError(f"adds tangents of one type, got {x.str_short()} and "
                         f"{y.str_short()}.", op="add_any")
    return x.update()


@add_any_p.def_impl
def _add_any_impl(x, y):
    return x + y


@add_any_p.def_jvp
def _add_any_jvp(primals, tangents):
    (x, y), (tx, ty) = primals, tangents
    return add_any_p.bind(x, y), add_tangents(tx, ty)


@add_any_p.def_transpose
def _add_any_transpose(ct, x, y):
    # a tangent map may add an instantiated zero (a constant, not linear):
    # it gets no cotangent
    return ct if is_linear(x) else None, ct if is_linear(y) else None


zeros_p = Primitive("zeros", params={"shape": tuple[int, ...], "dtype": np.dtype})
"""The primitive of a zero array of a static shape and dtype (`zeros`): a
symbolic `Zero` made concrete (`instantiate`)."""


@zeros_p.def_abstract_eval
def _zeros_shape(*, shape, dtype):
    return TensorType(shape, dtype)


@zeros_p.def_impl
def _zeros_impl(*, shape, dtype):

    return jnp.zeros(shape, dtype)


# A JVP rule whose primal results come out of a node that computes their
# tangents too (an ODE solved together with its sensitivities, a reverse
# pass differentiated with its own JVP) returns them through `jvp_primal`,
# an identity. Such a node depends on the tangents, so every result of it
# looks linear to transposition, which would then take the primal results
# for linear values; the marker says they are not, and a tangent map's
# transposition takes their value where the tangents are zero
# (`value_at_zero`). A loop's primal results need no marker: its
# `linearity` rule tells them from its tangent results (`linear_outputs`).
jvp_primal_p = Primitive("jvp_primal", params={})
"""The identity on a primal value a JVP rule computes together with the
tangents (`jvp_primal`), marked so that transposition takes it for a primal
value, not a linear one."""


@jvp_primal_p.def_abstract_eval
def _jvp_primal_shape(x):
    return x


@jvp_primal_p.def_impl
def _jvp_primal_impl(x):
    return x


@jvp_primal_p.def_jvp
def _jvp_primal_jvp(primals, tangents):
    # the marker stays on the primal; the tangent is not marked
    return jvp_primal_p.bind(primals[0]), tangents[0]


def jvp_primal(x):
    """`x`, a JVP rule's primal result taken out of a node that also
    computes tangents, marked as not depending on them (`jvp_primal_p`), so
    that the tangent map transposes:

    ```python
    @my_p.def_jvp
    def _my_jvp(primals, tangents):
        both = my_with_sensitivity_p.bind(*primals, *tangents)   # [y, dy]
        return sd.graph.jvp_primal(both[:n]), both[n:]
    ```
    """
    return jvp_primal_p.bind(x)


# type class -> function making a materialized zero of that type; the
# primitives of a non-tensor type register theirs (sparse: `sparse.assemble`
# of zero data)
_ZERO_MAKERS: dict[type, Callable] = {}


def register_zeros(type_cls: type, make: Callable) -> None:
    """How `zeros(t)` materializes a zero of a non-tensor type `type_cls`."""
    _ZERO_MAKERS[type_cls] = make


def zeros(t: AbstractType):
    """A materialized zero of type `t` (a `zeros` node for a tensor)."""
    if not isinstance(t, TensorType):
        make = _ZERO_MAKERS.get(type(t))
        assert make is not None, f"no zeros for {t}; this is a bug in sciad."
        return make(t)
    return zeros_p.bind(shape=t.shape, dtype=t.dtype)


def instantiate(x):
    """`x`, with a symbolic `Zero` made into a real array of zeros."""
    return zeros(x.type) if isinstance(x, Zero) else x


def add_tangents(a, b):
    """`a + b` for tangents or cotangents of one type; `Zero`s are skipped."""
    if isinstance(a, Zero):
        return b
    if isinstance(b, Zero):
        return a
    return add_any_p.bind(a, b)


# ---------------------------------------------------------------------------
# Forward mode


def _bind(prim: Primitive, args, params):
    out = prim.bind(*args, **params)
    return tuple(out) if prim.multiple_results else (out,)


def operand_name(prim: Primitive, i: int) -> str:
    """Operand `i` of `prim` in a message: "operand 1 (`b`)", with its name
    from the shape rule's signature where it has one."""
    try:
        names = [q.name for q in
                 inspect.signature(prim.abstract_eval_rule).parameters.values()
                 if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):  # no rule, or one without a signature
        names = []
    return f"operand {i} (`{names[i]}`)" if i < len(names) else f"operand {i}"


def _check_tangent(prim: Primitive, primal_type: AbstractType, t, what: str,
                   where: str):
    """A rule's tangent (for `where` = "output i") or cotangent (for an
    operand, `operand_name`) `t` must have its value's shape and dtype."""
    if isinstance(t, Zero):
        return
    output = where.startswith("output")
    kind, of = ("tangent", "output") if output else ("cotangent", "operand")
    tt = type_of(t)
    want = _tangent_type(primal_type)
    if not is_differentiable(primal_type):
        instead = "`Zero` (sciad.graph.Zero)" if output else "None"
        raise RuleError(
            f"the {what} returned a {kind} {tt.str_short()} for {where}, of the "
            f"non-differentiable type {primal_type.str_short()}; return {instead} there.",
            op=prim.name)
    if tt.update() != want.update():
        raise RuleError(
            f"the {what} returned a {kind} of type {tt.str_short()} for {where}, of "
            f"type {want.str_short()}; a {kind} has its {of}'s shape and dtype.",
            op=prim.name)


def jvp_node(prim: Primitive, primals: Sequence, tangents: Sequence, params: dict,
             out_types: Sequence[AbstractType] | None = None):
    """Applies `prim` to `(primals, tangents)`; returns `(outs, tangent_outs)` as
    tuples. Inputs without tangents are `Zero`s."""
    tangents = [t if not isinstance(t, Zero) and is_differentiable(type_of(p)) else
                (t if isinstance(t, Zero) else Zero(_tangent_type(type_of(p))))
                for p, t in zip(primals, tangents)]
    if all(isinstance(t, Zero) for t in tangents) or (
            out_types is not None and not any(is_differentiable(t) for t in out_types)):
        outs = _bind(prim, primals, params)
        return outs, tuple(Zero(_tangent_type(type_of(o))) for o in outs)
    if prim.jvp_rule is None:
        raise MissingRuleError(
            f"`{prim.name}` has no JVP rule, so it cannot be differentiated. Define "
            f"`@{prim.name}_p.def_jvp` (and `def_vjp` or `def_transpose` for reverse "
            "mode if you like).", op=prim.name)
    out, tout = prim.jvp_rule(primals, tangents, **params)
    if prim.multiple_results:
        outs, touts = tuple(out), tuple(tout)
    else:
        outs, touts = (out,), (tout,)
    if len(touts) != len(outs):
        raise RuleError(f"the JVP rule returned {len(touts)} tangents for {len(outs)} "
                        "outputs.", op=prim.name)
    fixed = []
    for k, (o, t) in enumerate(zip(outs, touts)):
        _check_tangent(prim, type_of(o), t, "JVP rule", f"output {k}")
        fixed.append(t if t is not None else Zero(_tangent_type(type_of(o))))
    return outs, tuple(fixed)


class _JVPInterpreter(Interpreter):
    """Emits each node's JVP into the current trace; every value is a pair
    `(primal, tangent)`."""

    def literal(self, lit: Literal):
        return literal_operand(lit), Zero(_tangent_type(lit.type))

    def run_node(self, node: Node, invals: Sequence) -> list:
        with emitting_for(node.source):  # also names the node in a rule's error
            outs, touts = jvp_node(node.primitive, [p for p, _ in invals],
                                   [t for _, t in invals], dict(node.params),
                                   [v.type for v in node.outputs])
        return list(zip(outs, touts))


def jvp_eval(graph: Graph, primals: Sequence, tangents: Sequence):
    """Emits `graph` and its JVP into the current trace.

    `primals` are tracers or constants, `tangents` tracers or `Zero`s. Returns
    `(outs, tangent_outs)` lists. Equal nodes of `graph` are one node first
    (`merge_duplicates`), as in reverse mode.
    """
    graph = merge_duplicates(graph)
    pairs = _JVPInterpreter(graph).run(*zip(primals, tangents))
    return [p for p, _ in pairs], [t for _, t in pairs]


# ---------------------------------------------------------------------------
# Transposition of linear graphs, and reverse mode


class _Emit(Interpreter):
    """Emits each node again into the current trace, on the values of its
    operands (tracers or constants); a re-emitted node keeps its source."""

    def literal(self, lit: Literal):
        return literal_operand(lit)

    def run_node(self, node: Node, invals: Sequence) -> tuple:
        with emitting_for(node.source):
            return _bind(node.primitive, invals, dict(node.params))


def linear_outputs(node: Node, linear: Sequence[bool]) -> list[bool]:
    """Which outputs of `node` depend on its operands flagged `linear`: none
    where no operand is; else its float and complex outputs, less those that
    its primitive's `linearity` rule finds independent of the linear
    operands (a loop in a tangent map computes its primal carries and its
    tangent carries, and only the latter read the tangents), or, without
    one, those its `dce` rule computes without them. Outputs of other types
    (integers, a factorization) never depend on linear operands: a map that
    is linear in them cannot. Nor does a `jvp_primal`."""
    n = len(node.outputs)
    if not any(linear) or node.primitive is jvp_primal_p:
        return [False] * n
    if n == 1 and node.primitive.linearity_rule is None:
        return [is_differentiable(node.outputs[0].type)]
    diff = [is_differentiable(v.type) for v in node.outputs]
    if node.primitive.linearity_rule is not None:
        flags = node.primitive.linearity_rule(list(linear), **node.params)
        return [bool(f) and d for f, d in zip(flags, diff)]
    rule = node.primitive.dce_rule
    if rule is None or sum(diff) < 2:
        return diff
    lin_vars = {a for a, lin in zip(node.inputs, linear) if lin and isinstance(a, Var)}
    out = []
    for i, d in enumerate(diff):
        sub = rule(node, [j == i for j in range(n)]) if d else None
        out.append(d and any(isinstance(a, Var) and a in lin_vars
                             for a in (node.inputs if sub is None else sub.inputs)))
    return out


def graph_linear_outputs(graph: Graph, linear: Sequence[bool]) -> list[bool]:
    """Which outputs of `graph` depend on its inputs flagged `linear`
    (`linear_outputs`, node by node)."""
    lin: set[Var] = {v for v, f in zip(graph.inputs, linear) if f}
    for node in graph.nodes:
        flags = linear_outputs(node, [isinstance(a, Var) and a in lin for a in node.inputs])
        lin.update(v for v, f in zip(node.outputs, flags) if f)
    return [isinstance(a, Var) and a in lin for a in graph.outputs]


class _Lazy:
    """A value emitted only when a node reads it."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], Any]):
        self.make = make


class _EmitNonlinear(_Emit):
    """Emits the nodes of a graph that do not depend on its linear inputs
    (whose values are `UndefinedPrimal`s); the others, whose outputs are
    linear too, are set aside in `linear_nodes` for transposition.

    A node reading both (a loop of a tangent map, carrying primals and
    tangents) is set aside whole, and its outputs that do not depend on the
    linear operands (`linear_outputs`) get values: its `dce` rule's node for
    them, emitted here (the loop of the primal carries alone), or, where
    that reads a linear operand too, the node emitted where the linear
    inputs are zero, emitted only if a node reads them. The value of a
    `jvp_primal` of a linear value is taken there too. Each linear value
    knows how to emit its own value at zero (`UndefinedPrimal.at_zero`)."""

    def __init__(self, graph: Graph):
        super().__init__(graph)
        self.linear_nodes: list[Node] = []
        self._at_zero: dict[Node, tuple] = {}

    def read(self, a):
        # (Interpreter.read inlined: every operand of every node comes here)
        x = literal_operand(a) if isinstance(a, Literal) else self.env[a]
        if isinstance(x, _Lazy):
            x = x.make()
            self.env[a] = x
        return x

    def run_node(self, node: Node, invals: Sequence):
        linear = [isinstance(x, UndefinedPrimal) for x in invals]
        if not any(linear):
            return super().run_node(node, invals)
        if node.primitive is jvp_primal_p:
            return [value_at_zero(invals[0])]
        self.linear_nodes.append(node)
        out_lin = linear_outputs(node, linear)
        outs: list = [UndefinedPrimal(v.type, self._zero_of(node, i)) if lin else None
                      for i, (v, lin) in enumerate(zip(node.outputs, out_lin))]
        if all(out_lin):
            return outs
        known = [not f for f in out_lin]
        rule = node.primitive.dce_rule
        sub = rule(node, known) if rule is not None else None
        lin_vars = {a for a, f in zip(node.inputs, linear) if f}
        if sub is not None and not any(a in lin_vars for a in sub.inputs
                                       if isinstance(a, Var)):
            vals = dict(zip(sub.outputs, super().run_node(sub, [self.read(a)
                                                               for a in sub.inputs])))
            return [o if o is not None else vals[v] for o, v in zip(outs, node.outputs)]
        return [o if o is not None else _Lazy(self._zero_of(node, i))
                for i, o in enumerate(outs)]

    def _zero_of(self, node: Node, i: int) -> Callable[[], Any]:
        def make():
            if node not in self._at_zero:
                self._at_zero[node] = tuple(super(_EmitNonlinear, self).run_node(
                    node, [value_at_zero(self.read(a)) for a in node.inputs]))
            return self._at_zero[node][i]
        return make


def emit_nonlinear(graph: Graph, linear: Sequence[bool], values: Sequence) -> list:
    """Emits the nodes of `graph` that do not depend on its inputs flagged
    `linear` (`values`: the other inputs, in order); returns its outputs,
    each a value or, where it depends on them, an `UndefinedPrimal`."""
    it = iter(values)
    fwd = _EmitNonlinear(graph)
    return fwd.run(*(UndefinedPrimal(v.type) if lin else next(it)
                     for v, lin in zip(graph.inputs, linear)))


def _backward(nodes: Sequence[Node], ct_env: dict, node_cts: Callable) -> None:
    """The reverse pass over `nodes`: each node whose outputs have a nonzero
    cotangent in `ct_env` gets its operands' from `node_cts(node, cts)` (a
    cotangent, or None or a `Zero`, per operand), added into `ct_env`."""
    for node in reversed(nodes):
        cts = [ct_env.pop(v, Zero(_tangent_type(v.type))) for v in node.outputs]
        if all(isinstance(c, Zero) for c in cts):
            continue
        with emitting_for(node.source):  # also names the node in a rule's error
            in_cts = node_cts(node, cts)
            for a, ct in zip(node.inputs, in_cts):
                if ct is not None and not isinstance(ct, Zero):
                    ct_env[a] = add_tangents(ct_env.get(a, Zero(a.type)), ct)


def transpose_eval(graph: Graph, linear: Sequence[bool], values: Sequence,
                   cts: Sequence, undefined: Sequence[UndefinedPrimal] | None = None
                   ) -> list:
    """Transposes `graph` with respect to its inputs flagged `linear`.

    The graph must be linear in those inputs. `values` gives the other
    inputs (in order, skipping linear ones), `cts` a cotangent (or `Zero`)
    per output. Emits the nonlinear nodes on `values`, then the transposed
    linear nodes in reverse; returns a cotangent (or `Zero`) per linear input.
    `undefined` may give the linear inputs' placeholders (a rule
    transposing its body in place passes its own operands), so that their
    values at zero are the enclosing map's.
    """
    it = iter(values)
    lin_it = iter(undefined if undefined is not None else
                  [UndefinedPrimal(v.type) for v, f in zip(graph.inputs, linear) if f])
    fwd = _EmitNonlinear(graph)
    fwd.run(*(next(lin_it) if is_lin else next(it)
              for v, is_lin in zip(graph.inputs, linear)))

    ct_env: dict[Var, Any] = {}
    for a, ct in zip(graph.outputs, cts):
        if isinstance(a, Var) and is_linear(fwd.read(a)) and not isinstance(ct, Zero):
            ct_env[a] = add_tangents(ct_env.get(a, Zero(a.type)), ct)

    def transpose_node(node: Node, node_cts: list) -> tuple:
        prim = node.primitive
        if prim.transpose_rule is None:
            raise MissingRuleError(
                f"`{prim.name}` has no transpose rule, so it cannot be differentiated "
                f"in reverse mode. Define `@{prim.name}_p.def_transpose`, or a VJP with "
                f"`@{prim.name}_p.def_vjp`.", op=prim.name, source=node.source)
        args = [fwd.read(a) for a in node.inputs]
        ct_arg = tuple(node_cts) if prim.multiple_results else node_cts[0]
        in_cts = _as_ct_tuple(prim, prim.transpose_rule(ct_arg, *args, **node.params),
                              len(node.inputs), "transpose rule", node)
        for i, (a, arg, ct) in enumerate(zip(node.inputs, args, in_cts)):
            if ct is None or isinstance(ct, Zero):
                continue
            if not is_linear(arg):
                raise RuleError(f"the transpose rule returned a cotangent for "
                                f"{operand_name(prim, i)}, which it is not linear in "
                                f"({arg!r}); return None there.",
                                op=prim.name, source=node.source)
            _check_tangent(prim, a.type, ct, "transpose rule", operand_name(prim, i))
        return in_cts

    _backward(fwd.linear_nodes, ct_env, transpose_node)
    return [ct_env.get(v, Zero(_tangent_type(v.type)))
            for v, is_lin in zip(graph.inputs, linear) if is_lin]


def expansion_transpose(prim: Primitive, expand: Callable) -> Callable:
    """The transpose rule of `prim` from `expand(*operands, **params)`, which
    computes what a node of `prim` computes with other primitives (a
    checkpointed reverse pass as plain loops): the expansion, traced on the
    operands' types and transposed node by node."""
    def rule(cts, *args, **params):

        g, _, _ = trace_flat(lambda *a: list(expand(*a, **params)),
                             tuple(type_of(a) for a in args),
                             name=prim.name.replace(".", "_"))
        linear = [is_linear(a) for a in args]
        cts = list(cts) if prim.multiple_results else [cts]
        lin_cts = iter(transpose_eval(g, linear, [a for a in args if not is_linear(a)], cts,
                                      [a for a in args if is_linear(a)]))
        return tuple(next(lin_cts) if f else None for f in linear)
    return rule


def vjp_transpose(prim: Primitive) -> Callable:
    """The transpose rule of a primitive with a VJP whose tangent-map form is
    linear in some operands only where the others are fixed (an ODE solved
    together with its sensitivities): its VJP where the linear inputs of the
    map are zero (`value_at_zero`), which is the map's transpose, as the
    derivative of a linear map is the map. The VJP also does the work of the
    cotangents of the other operands, which are dropped."""
    def rule(cts, *args, **params):
        linear = [is_linear(a) for a in args]
        primals = [value_at_zero(a) for a in args]
        outs = _bind(prim, primals, params)
        cts = list(cts) if prim.multiple_results else [cts]
        in_cts = vjp_node(prim, primals, outs, cts, params)
        return tuple(c if f else None for c, f in zip(in_cts, linear))
    return rule


def _as_ct_tuple(prim, in_cts, n: int, what: str, node=None) -> tuple:
    if not isinstance(in_cts, (tuple, list)):
        in_cts = (in_cts,)
    if len(in_cts) != n:
        raise RuleError(f"the {what} returned {len(in_cts)} cotangents for {n} operands "
                        "(use None for operands without one).", op=prim.name,
                        source=node.source if node is not None else None)
    return tuple(in_cts)


def _derived_vjp(prim: Primitive, primals: Sequence, cts: Sequence, params: dict,
                 wrt: Sequence[bool] | None = None):
    """The VJP of one application of `prim` from its JVP rule: trace the JVP
    with symbolic tangents into a graph linear in them, then transpose it.
    Only the operands flagged in `wrt` (default: every float and complex one)
    get a tangent: the others' are `Zero`s, so the rule forms nothing for
    them (`x ** c` with a constant `c` forms no `log(x)`)."""
    diff = [i for i, p in enumerate(primals)
            if is_differentiable(type_of(p)) and (wrt is None or wrt[i])]
    if not diff:
        return [None] * len(primals)
    types = [_tangent_type(type_of(primals[i])) for i in diff]

    def linear_part(*tans):
        ts = [Zero(_tangent_type(type_of(p))) for p in primals]
        for i, t in zip(diff, tans):
            ts[i] = t
        _, touts = jvp_node(prim, primals, ts, params)
        return [instantiate(t) for t in touts]

    graph, _, _, captured = trace_flat(linear_part, tuple(types), name=f"{prim.name}_jvp",
                                       closure=True)
    n = len(types)
    linear = [True] * n + [False] * len(captured)
    lin_cts = transpose_eval(graph, linear, captured, cts)
    out: list = [None] * len(primals)
    for i, ct in zip(diff, lin_cts):
        out[i] = ct
    return out


def _checked_in_cts(prim: Primitive, res, primals: Sequence, what: str, node) -> list:
    """A VJP rule's result as a list of cotangents, one per operand, each of
    its operand's type."""
    res = _as_ct_tuple(prim, res, len(primals), what, node)
    for i, (p, ct) in enumerate(zip(primals, res)):
        if ct is not None and not isinstance(ct, Zero):
            _check_tangent(prim, type_of(p), ct, what, operand_name(prim, i))
    return list(res)


# The operands the reverse pass being emitted holds fixed, for the rule it
# is running: one set of ids per rule call, innermost last.
_held_fixed: list[frozenset[int]] = []


class _holding:
    """While a VJP rule runs: its operands not flagged in `wrt` are held
    fixed (`needs_ct` says so)."""

    def __init__(self, primals: Sequence, wrt: Sequence[bool] | None):
        self.ids = frozenset(id(p) for p, w in zip(primals, wrt) if not w) if wrt else (
            frozenset())

    def __enter__(self):
        _held_fixed.append(self.ids)

    def __exit__(self, *exc):
        _held_fixed.pop()


def needs_ct(x) -> bool:
    """Whether a VJP rule must form a cotangent for its operand `x`: a traced
    float or complex value that the reverse pass differentiates. A constant
    needs none, nor a traced value the pass holds fixed (computed only from
    constants, integers or inputs not differentiated): a rule that forms one
    anyway builds, for `x ** c`, a `log(x)` that a second derivative then
    meets (NaN for a negative `x`, times zero)."""
    return (isinstance(x, Tracer) and is_differentiable(type_of(x))
            and not (_held_fixed and id(x) in _held_fixed[-1]))


def vjp_node(prim: Primitive, primals: Sequence, outs: Sequence, cts: Sequence,
             params: dict, node: Node | None = None,
             wrt: Sequence[bool] | None = None) -> list:
    """Cotangents of `prim`'s operands for output cotangents `cts`. `wrt`
    flags the operands that need one (default: every float and complex
    operand); the others get None, and the rule sees them as held fixed
    (`needs_ct`)."""
    if prim.vjp_rule is not None:
        ct_arg = tuple(cts) if prim.multiple_results else cts[0]
        out_arg = tuple(outs) if prim.multiple_results else outs[0]
        with _holding(primals, wrt):
            res = prim.vjp_rule(primals, out_arg, ct_arg, **params)
        in_cts = _checked_in_cts(prim, res, primals, "VJP rule", node)
    else:
        in_cts = _derived_vjp(prim, primals, cts, params, wrt)
    return in_cts if wrt is None else [ct if w else None for ct, w in zip(in_cts, wrt)]


def _split_fwd(prim: Primitive, args: list, params: dict, node: Node,
               wrt: Sequence[bool]):
    """The forward half of a two-part VJP: the outputs (as a tuple) and the
    residuals the backward half gets."""
    if prim.vjp_bwd_rule is None:
        raise MissingRuleError(
            f"`{prim.name}` defines `def_vjp_fwd` without `def_vjp_bwd`; define both.",
            op=prim.name, source=node.source)
    with _holding(args, wrt):
        outs, res = prim.vjp_fwd_rule(args, **params)
    outs = tuple(outs) if prim.multiple_results else (outs,)
    if len(outs) != len(node.outputs):
        raise RuleError(f"the vjp_fwd rule returned {len(outs)} outputs for "
                        f"{len(node.outputs)}.", op=prim.name, source=node.source)
    for v, o in zip(node.outputs, outs):
        if type_of(o) != v.type:
            raise RuleError(f"the vjp_fwd rule returned {type_of(o).str_short()} for an "
                            f"output of type {v.type.str_short()}.", op=prim.name,
                            source=node.source)
    return outs, res


def _split_bwd(prim: Primitive, res, cts: Sequence, primals: Sequence, params: dict,
               node: Node, wrt: Sequence[bool]) -> list:
    ct_arg = tuple(cts) if prim.multiple_results else cts[0]
    with _holding(primals, wrt):
        in_cts = prim.vjp_bwd_rule(res, ct_arg, **params)
    return _checked_in_cts(prim, in_cts, primals, "vjp_bwd rule", node)


class _VJPForward(_Emit):
    """Emits the forward nodes; a node differentiated in two halves (its
    primitive has a `vjp_fwd` rule) emits that half and keeps its residuals,
    where one of its operands is `active`."""

    def __init__(self, graph: Graph, active: set[Var]):
        super().__init__(graph)
        self.active = active
        self.residuals: dict[Node, Any] = {}

    def run_node(self, node: Node, invals: Sequence):
        flags = _active_operands(node, self.active)
        if node.primitive.vjp_fwd_rule is not None and flags is not None:
            with emitting_for(node.source):
                outs, self.residuals[node] = _split_fwd(node.primitive, invals,
                                                        dict(node.params), node, flags)
            return outs
        return super().run_node(node, invals)


def active_values(graph: Graph, wrt: Sequence[bool] | None = None) -> set[Var]:
    """The values of `graph` that depend on the inputs flagged in `wrt`
    (default: every float and complex input) through float or complex
    values: those a reverse pass gives cotangents. Constants, integers and
    what is computed from them alone are inactive, so a rule never forms a
    derivative with respect to them (`x ** c` with a constant `c`, or with
    `c` converted from an integer, forms no `log(x)`)."""
    flags = wrt if wrt is not None else [True] * len(graph.inputs)
    active = {v for v, w in zip(graph.inputs, flags) if w and is_differentiable(v.type)}
    for node in graph.nodes:
        if any(isinstance(a, Var) and a in active for a in node.inputs):
            active.update(v for v in node.outputs if is_differentiable(v.type))
    return active


def _active_operands(node: Node, active: set[Var]) -> list[bool] | None:
    """Which operands of `node` are active, or None if none is."""
    flags = [isinstance(a, Var) and a in active for a in node.inputs]
    return flags if any(flags) else None


def vjp_eval(graph: Graph, primals: Sequence, wrt: Sequence[bool] | None = None):
    """Emits `graph` into the current trace; returns `(outs, backward)` where
    `backward(cts)` emits the reverse pass and returns a cotangent (or `Zero`)
    per input.

    `wrt` flags the inputs differentiated (default: every float and complex
    input); the others get `Zero`s, and a node computed from them alone is
    not differentiated at all (see `active_values`). Equal nodes of `graph`
    are one node first (`merge_duplicates`): a value computed twice gets one
    cotangent, the sum of its uses', so the checks on a node's cotangents
    judge the whole function's derivative. `backward` must be called in the
    same trace."""
    graph = merge_duplicates(graph)
    active = active_values(graph, wrt)
    fwd = _VJPForward(graph, active)
    outs = fwd.run(*primals)

    def vjp_of(node: Node, cts: list) -> list:
        flags = _active_operands(node, active)
        if flags is None:
            return []
        primals = [fwd.read(a) for a in node.inputs]
        if node in fwd.residuals:
            in_cts = _split_bwd(node.primitive, fwd.residuals[node], cts, primals,
                                dict(node.params), node, flags)
        else:
            in_cts = vjp_node(node.primitive, primals, [fwd.read(v) for v in node.outputs],
                              cts, dict(node.params), node, flags)
        # inactive operands (constants, integers, what only they give) take none
        return [ct if f else None for f, ct in zip(flags, in_cts)]

    def backward(cts: Sequence) -> list:
        ct_env: dict[Var, Any] = {}
        for a, ct in zip(graph.outputs, cts):
            if isinstance(a, Var) and a in active and not isinstance(ct, Zero):
                ct_env[a] = add_tangents(ct_env.get(a, Zero(a.type)), ct)
        _backward(graph.nodes, ct_env, vjp_of)
        return [ct_env.get(v, Zero(_tangent_type(v.type))) for v in graph.inputs]

    return outs, backward


# ---------------------------------------------------------------------------
# Graph -> Graph forms


def _differentiable_inputs(graph: Graph) -> list[int]:
    return [i for i, v in enumerate(graph.inputs) if is_differentiable(v.type)]


def jvp_graph(graph: Graph) -> Graph:
    """The JVP of `graph`: inputs `(*primals, *tangents)`, outputs
    `(*outs, *tangent_outs)`. Tangent inputs exist for the float and complex
    inputs only; tangent outputs are materialized (zeros where symbolic)."""
    diff = _differentiable_inputs(graph)
    in_types = list(graph.in_types) + [graph.inputs[i].type.update() for i in diff]
    n = len(graph.inputs)

    def fn(*args):
        primals = args[:n]
        tangents: list = [Zero(v.type.update()) for v in graph.inputs]
        for i, t in zip(diff, args[n:]):
            tangents[i] = t
        outs, touts = jvp_eval(graph, primals, tangents)
        return list(outs) + [instantiate(t) for t in touts]

    g, _, _ = trace_flat(fn, tuple(in_types), name=f"jvp_{graph.name}")
    return g


class VJPGraph:
    """Reverse mode split in two: `forward(*primals) -> (*outs, *saved)` and
    `backward(*saved, *cts) -> (*input_cts)`. `saved` are the primal values the
    backward part needs, listed by `saved_types`."""

    def __init__(self, forward: Graph, backward: Graph, n_outputs: int):
        self.forward = forward
        self.backward = backward
        self.n_outputs = n_outputs

    @property
    def saved_types(self) -> tuple[AbstractType, ...]:
        return self.forward.out_types[self.n_outputs:]

    def __str__(self) -> str:
        return f"{self.forward}\n{self.backward}"


def vjp_graph(graph: Graph, wrt: Sequence[bool] | None = None) -> VJPGraph:
    """The VJP of `graph` as a forward graph (outputs, then saved values) and
    a backward graph (saved values and output cotangents -> a cotangent per
    differentiated input, materialized).

    `wrt` flags the inputs differentiated (default: every float and complex
    input); the backward graph has a cotangent output for each of those only,
    and the forward graph saves only what the backward graph reads."""
    n_in = len(graph.inputs)
    diff_out = [i for i, a in enumerate(graph.outputs) if is_differentiable(a.type)]
    ct_types = [graph.outputs[i].type.update() for i in diff_out]
    diff_in = [i for i in _differentiable_inputs(graph) if wrt is None or wrt[i]]

    def fn(*args):
        outs, backward = vjp_eval(graph, args[:n_in], wrt)
        cts: list = [Zero(a.type.update()) for a in graph.outputs]
        for i, c in zip(diff_out, args[n_in:]):
            cts[i] = c
        in_cts = backward(cts)
        return list(outs) + [instantiate(in_cts[i]) for i in diff_in]

    whole, _, _ = trace_flat(fn, tuple(graph.in_types) + tuple(ct_types),
                             name=f"vjp_{graph.name}")
    # a cotangent a rule formed and no output reads (a `def_vjp` rule's for
    # an operand not differentiated) must not make its operands saved values
    return split_graph(dce(whole), n_in, len(graph.outputs))


def split_graph(whole: Graph, n_primal_inputs: int, n_outputs: int) -> VJPGraph:
    """Splits a combined `(primals, cts) -> (outs, in_cts)` graph into the
    part that needs no cotangent (forward) and the rest (backward)."""
    ct_inputs = set(whole.inputs[n_primal_inputs:])
    tainted: set[Var] = set(ct_inputs)
    fwd_nodes, bwd_nodes = [], []
    for node in whole.nodes:
        if any(isinstance(a, Var) and a in tainted for a in node.inputs):
            bwd_nodes.append(node)
            tainted.update(node.outputs)
        else:
            fwd_nodes.append(node)
    bwd_outputs = whole.outputs[n_outputs:]
    used: list[Var] = []
    seen: set[Var] = set()
    bwd_defined = set(tainted)

    def need(a):
        if isinstance(a, Var) and a not in bwd_defined and a not in seen:
            seen.add(a)
            used.append(a)

    for node in bwd_nodes:
        for a in node.inputs:
            need(a)
    for a in bwd_outputs:
        need(a)
    forward = Graph(whole.inputs[:n_primal_inputs], tuple(fwd_nodes),
                    tuple(whole.outputs[:n_outputs]) + tuple(used), f"{whole.name}_fwd")
    saved_in = [Var(v.type, v.hint) for v in used]
    sub = dict(zip(used, saved_in))

    def s(a):
        return sub.get(a, a) if isinstance(a, Var) else a

    bwd = tuple(n.replace(inputs=tuple(s(a) for a in n.inputs)) for n in bwd_nodes)
    backward = Graph(tuple(saved_in) + tuple(whole.inputs[n_primal_inputs:]), bwd,
                     tuple(s(a) for a in bwd_outputs), f"{whole.name}_bwd")
    return VJPGraph(forward, backward, n_outputs)


def check_linear_dtype(x, op: str) -> None:
    t = type_of(x)
    if not is_differentiable(t):
        raise DTypeError(f"can only differentiate with respect to float or complex "
                         f"arrays, got {t.str_short()}.", op=op)


# (the batch, sparsity and cost rules of `add_any` and `jvp_primal` are
# registered by graph/_batch.py, _sparsity.py and _cost.py, which import this module)
