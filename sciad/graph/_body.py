"""Closed bodies: how a node holds a function.

A higher-order node (`call`, `linalg.solve_operator`, `scan`, `while`, `cond`,
and later `root`, `odeint`, `eigsh`) holds its function as a `Graph` param,
its *body*, and passes it operands in one fixed order:

    body inputs = (*consts, *carries, *per-step inputs)

- `consts` are the values the function closed over (traced values of the
  enclosing function, which become explicit operands of the node), and any
  other operand that is the same for every application (a loop-invariant
  matrix, the parameters of a matrix-free operator);
- `carries` are the state a loop threads from one step to the next (a
  `while` loop's state, a scan's carry);
- per-step inputs are the slices of stacked operands a scan reads at each
  step (`xs`), or the vector a matvec is applied to.

A node holds its function as a `Body`: the graph together with how many
of each there are (`num_consts`, `num_carry`, `num_xs`), so printing,
verification, serialization and the passes treat every body alike, and the
rules below (tracing, inlining, differentiating, hoisting and pruning a
body) are written once.
"""

from __future__ import annotations

import collections
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

import jax

from ._core import Graph, Literal, Node, Var, has_effects, must_run
from ._types import AbstractType

# _trace, _autodiff and _batch are imported inside the functions that use
# them: each of them imports this module (Body), a cycle at import time.

_tree = jax.tree_util


@dataclass(frozen=True, slots=True, eq=False)
class Body(Graph):
    """A closed graph with its operand layout: `inputs = (*consts, *carries,
    *xs)`, `num_consts + num_carry + num_xs == len(inputs)` (`verify`
    checks it).

    A `Body` is a `Graph` (everything that reads a graph reads a body), and
    `replace` keeps the type and the counts; the helpers of this module that
    add or drop inputs (`drop_inputs`, `hoist`, `hoist_nodes`) update them.
    """

    num_consts: int = 0
    num_carry: int = 0
    num_xs: int = 0

    @classmethod
    def of(cls, graph: Graph, num_consts: int = 0, num_carry: int = 0) -> "Body":
        """`graph` as a body of `num_consts` consts and `num_carry` carries;
        its other inputs are per-step inputs."""
        return cls(graph.inputs, graph.nodes, graph.outputs, graph.name, num_consts,
                   num_carry, len(graph.inputs) - num_consts - num_carry)

    @property
    def layout(self) -> tuple[int, int, int]:
        """`(num_consts, num_carry, num_xs)`."""
        return self.num_consts, self.num_carry, self.num_xs

    def groups(self, seq) -> tuple[list, list, list]:
        """`seq` (the node's operands, or the body's inputs) split into
        consts, carries and per-step inputs."""
        seq = list(seq)
        nc, nk = self.num_consts, self.num_carry
        return seq[:nc], seq[nc:nc + nk], seq[nc + nk:]

    def replace(self, **kw) -> "Body":
        fields = dict(inputs=self.inputs, nodes=self.nodes, outputs=self.outputs,
                      name=self.name, num_consts=self.num_consts, num_carry=self.num_carry,
                      num_xs=self.num_xs)
        fields.update(kw)
        return Body(**fields)

    def __repr__(self) -> str:
        return (f"<Body {self.name}: {self.num_consts} consts, {self.num_carry} carries, "
                f"{self.num_xs} xs, {len(self.nodes)} nodes, {len(self.outputs)} outputs>")


def layout(name: str, fields: Sequence[str], doc: str):
    """A named layout of a node's flat operands or outputs: a `NamedTuple`
    class of the groups `fields` (lists), so rules name a group
    (`outs.carry`, `ops.ct_ys`) instead of slicing by counts.
    `cls.split(seq, *sizes)` groups `seq` (the last group takes the rest;
    `sizes` the others' lengths), `value.flat()` joins the groups again."""
    base = collections.namedtuple(name, fields)

    def split(cls, seq, *sizes):
        seq, groups, k = list(seq), [], 0
        for n in sizes:
            groups.append(seq[k:k + n])
            k += n
        return cls(*groups, seq[k:])

    def flat(self) -> list:
        return [a for g in self for a in g]

    return type(name, (base,), {"__slots__": (), "__doc__": doc,
                                "__module__": sys._getframe(1).f_globals.get("__name__"),
                                "split": classmethod(split), "flat": flat})


def as_body(graph: Graph, num_consts: int = 0, num_carry: int = 0) -> Body:
    """`graph` as a `Body` with the given counts (a `Body` already so is
    returned as it is)."""
    if type(graph) is Body and graph.layout == (num_consts, num_carry, len(graph.inputs)
                                                 - num_consts - num_carry):
        return graph
    return Body.of(graph, num_consts, num_carry)


def applied_body(graph: Graph) -> Body:
    """`graph` as the body of a function applied once (`call`, `cond`'s
    branches, `checkpoint`): every operand is a const."""
    return as_body(graph, len(graph.inputs))


def trace_body(fn: Callable, in_types: Sequence[AbstractType], *, name: str):
    """Traces `fn(*args)` (flat arguments of `in_types`) as a closed body.

    Returns `(graph, consts, out_tree)`: `graph.inputs` are the closed-over
    values first, then `fn`'s arguments; `consts` are the values to pass for
    the former (traced values of enclosing traces); `out_tree` is the pytree
    structure of `fn`'s result, whose leaves are `graph.outputs`.
    """
    from ._trace import trace_flat

    graph, _, out_tree, consts = trace_flat(lambda *a: fn(*a), tuple(in_types),
                                            closure=True, name=name)
    n = len(in_types)
    if consts:
        graph = graph.replace(inputs=graph.inputs[n:] + graph.inputs[:n])
    return graph, list(consts), out_tree


def inline(graph: Graph, args: Sequence) -> list:
    """Emits `graph`'s nodes into the current trace on `args` (each node keeps
    its source line); returns its outputs."""
    from ._autodiff import _Emit

    return list(_Emit(graph).run(*args))


def permute(graph: Graph, inputs: Sequence[int] | None = None,
            outputs: Sequence[int] | None = None) -> Graph:
    """`graph` with its inputs (outputs) listed in the order `inputs`
    (`outputs`) gives, as indices into the current lists. Outputs may be
    dropped or repeated; inputs must be a permutation."""
    ins = graph.inputs if inputs is None else tuple(graph.inputs[i] for i in inputs)
    assert inputs is None or sorted(inputs) == list(range(len(graph.inputs))), \
        "permute: inputs must be a permutation"
    outs = graph.outputs if outputs is None else tuple(graph.outputs[i] for i in outputs)
    return graph.replace(inputs=ins, outputs=outs)


def jvp_body(graph: Graph, nonzero: Sequence[bool], *, name: str | None = None,
             instantiate: Sequence[bool] | None = None):
    """The JVP of a body for tangents on the inputs flagged `nonzero`.

    Returns `(jgraph, out_nonzero)`: `jgraph` maps `(*primals,
    *tangents[nonzero])` to `(*outs, *tangent_outs[out_nonzero])`, where
    `out_nonzero[i]` says whether output `i`'s tangent is not symbolically
    zero (or `instantiate[i]` asks for it anyway, as zeros). The tangent
    graph is written with sciad ops, so it can be differentiated again.
    """
    from ._autodiff import Zero, _tangent_type, instantiate as inst, is_differentiable, jvp_eval
    from ._trace import trace_flat

    n = len(graph.inputs)
    nonzero = [bool(z) and is_differentiable(v.type) for z, v in zip(nonzero, graph.inputs)]
    force = list(instantiate) if instantiate is not None else [False] * len(graph.outputs)
    t_types = [graph.inputs[i].type.update() for i in range(n) if nonzero[i]]
    out_nz: list[bool] = []

    def fn(*args):
        primals = args[:n]
        it = iter(args[n:])
        tangents = [next(it) if nz else Zero(_tangent_type(v.type))
                    for v, nz in zip(graph.inputs, nonzero)]
        outs, touts = jvp_eval(graph, primals, tangents)
        out_nz[:] = [(not isinstance(t, Zero) or f) and is_differentiable(a.type)
                     for t, f, a in zip(touts, force, graph.outputs)]
        return list(outs) + [inst(t) for t, nz in zip(touts, out_nz) if nz]

    jg, _, _ = trace_flat(fn, tuple(graph.in_types) + tuple(t_types),
                          name=name or f"jvp_{graph.name}")
    return jg, out_nz


def applied_batch_rule(prim):
    """The batch rule of a node that applies its body once to its operands
    (`call`, `checkpoint`): the same node on the body batched along the
    batched operands (moved to the front), its outputs batched where the
    batched body's are."""
    from ._batch import batch_body, batch_size_of, front_where

    def rule(args, dims, *, body):
        size = batch_size_of(args, dims)
        flags = [d is not None for d in dims]
        g, out_b = batch_body(body, flags, size)
        res = prim.bind(*front_where(args, dims, flags, size), body=applied_body(g))
        return list(res), [0 if b else None for b in out_b]

    return rule


def live_inputs(graph: Graph, used_outputs: Sequence[bool]) -> tuple[Graph, list[bool]]:
    """`graph` with only its used outputs (and the nodes they need), and which
    of its inputs those still read. Nodes that must run (`must_run`: effects,
    or checks that may raise) are kept. A node of which only some outputs
    are needed (a loop whose tangent carries are dead) becomes its `dce`
    rule's node for them, reading only what they need."""
    outs = [a for a, u in zip(graph.outputs, used_outputs) if u]
    live = {a for a in outs if isinstance(a, Var)}
    kept: list[Node] = []
    for node in reversed(graph.nodes):
        used = [v in live for v in node.outputs]
        if must_run(node) or any(used):
            rule = node.primitive.dce_rule
            if rule is not None and not has_effects(node) and any(used) and not all(used):
                node = rule(node, used) or node
            kept.append(node)
            live.update(a for a in node.inputs if isinstance(a, Var))
    kept.reverse()
    new = graph.replace(nodes=tuple(kept), outputs=tuple(outs))
    return new, [v in live for v in graph.inputs]


def drop_inputs(graph: Graph, keep: Sequence[bool]) -> Graph:
    """`graph` without the inputs not flagged in `keep` (they must be unused);
    a `Body`'s counts count the inputs kept."""
    inputs = tuple(v for v, k in zip(graph.inputs, keep) if k)
    if isinstance(graph, Body):
        c, k, x = graph.groups(keep)
        return graph.replace(inputs=inputs, num_consts=sum(c), num_carry=sum(k),
                             num_xs=sum(x))
    return graph.replace(inputs=inputs)


def prune_bodies(bodies: Sequence[Body], used: Sequence[bool], *, loop: bool = False,
                 readers: Sequence[Body] = ()):
    """Dead-code elimination for a node of `bodies` that share one input
    layout (the node's operands): `cond`'s branches, or the one body of
    `call`, `checkpoint`, `scan` or `while`. `used` flags the node's
    outputs, which are each body's outputs.

    With `loop`, each body's first `num_carry` outputs are its next carries:
    a carry stays live while its output is used or a live computation reads
    it, up to a fixed point, and the node's outputs kept are the live
    carries and the used per-step outputs. `readers` are bodies on the same
    inputs whose outputs are always needed (a `while` loop's predicate);
    they read what they read, and only lose inputs.

    Returns None if nothing is dead, else `(keep, live, bodies, readers)`:
    which operands (= body inputs) stay, which node outputs stay, and the
    pruned bodies, whose counts count what they keep."""
    first = bodies[0]
    nc, nk = first.num_consts, first.num_carry
    read = [False] * len(first.inputs)
    for r in readers:
        read = [a or b for a, b in zip(read, live_inputs(r, [True] * len(r.outputs))[1])]
    live = list(used)
    if loop:  # a carry the readers read is live
        live[:nk] = [u or r for u, r in zip(used[:nk], read[nc:nc + nk])]
    while True:
        pruned = [live_inputs(b, live) for b in bodies]
        keep = list(read)
        for _, in_live in pruned:
            keep = [a or b for a, b in zip(keep, in_live)]
        if not loop:
            break
        carry = [a or b for a, b in zip(live[:nk], keep[nc:nc + nk])]
        if carry == live[:nk]:
            break
        live[:nk] = carry
    if loop:  # a carry is an operand and an output: both stay or both go
        keep[nc:nc + nk] = live[:nk]
    if all(keep) and all(live):
        return None
    return (keep, live, [drop_inputs(g, keep) for g, _ in pruned],
            [drop_inputs(r, keep) for r in readers])


def dce_rule(*names: str, loop: bool = False, readers: Sequence[str] = (), skip: int = 0):
    """The `def_dce` rule of a node whose bodies are the params `names`
    (after `skip` leading operands that always stay, `cond`'s predicate):
    `prune_bodies` on them, with the params `readers` as readers."""
    def rule(node: Node, used: Sequence[bool]):
        p = node.params
        res = prune_bodies([p[n] for n in names], used, loop=loop,
                           readers=[p[n] for n in readers])
        if res is None:
            return None
        keep, live, bodies, kept_readers = res
        operands = node.inputs[skip:]
        return node.replace(
            inputs=node.inputs[:skip] + tuple(a for a, k in zip(operands, keep) if k),
            outputs=tuple(v for v, k in zip(node.outputs, live) if k),
            params=dict(p, **dict(zip(names, bodies)), **dict(zip(readers, kept_readers))))

    return rule


def invariant_nodes(graph: Graph, num_consts: int) -> list[bool]:
    """For each node of a loop body, whether it reads only the body's consts
    and constants (directly or through other such nodes): a loop-invariant
    value, the same at every step. Nodes with effects or subgraphs that
    hold effects never are."""
    inv: set[Var] = set(graph.inputs[:num_consts])
    flags = []
    for node in graph.nodes:
        ok = (not has_effects(node)
              and all(isinstance(a, Literal) or a in inv for a in node.inputs))
        if ok:
            inv.update(node.outputs)
        flags.append(ok)
    return flags


def split_invariant(graph: Graph, num_consts: int):
    """Splits a loop body into its loop-invariant part and the rest.

    Returns None if no node is invariant, else `(nodes, needed, body)`:
    the invariant nodes (reading the body's const inputs), the values among
    their outputs that the rest reads, and the rest as a body whose inputs
    are `(*consts, *needed, *others)` (the `needed` values as new consts)."""
    flags = invariant_nodes(graph, num_consts)
    if not any(flags):
        return None
    inv_nodes = [n for n, f in zip(graph.nodes, flags) if f]
    rest = [n for n, f in zip(graph.nodes, flags) if not f]
    inv_vars = {v for n in inv_nodes for v in n.outputs}
    needed: list[Var] = []
    seen: set[Var] = set()
    for a in [a for n in rest for a in n.inputs] + list(graph.outputs):
        if isinstance(a, Var) and a in inv_vars and a not in seen:
            seen.add(a)
            needed.append(a)
    new_vars = [Var(v.type, v.hint) for v in needed]
    env = dict(zip(needed, new_vars))

    def s(a):
        return env.get(a, a) if isinstance(a, Var) else a

    nodes = tuple(n.replace(inputs=tuple(s(a) for a in n.inputs)) for n in rest)
    body = graph.replace(inputs=graph.inputs[:num_consts] + tuple(new_vars)
                         + graph.inputs[num_consts:],
                         nodes=nodes, outputs=tuple(s(a) for a in graph.outputs))
    if isinstance(body, Body):
        body = body.replace(num_consts=body.num_consts + len(new_vars))
    return inv_nodes, needed, body


def hoist(graph: Graph, num_consts: int, consts: Sequence) -> tuple[Graph, list]:
    """Loop-invariant code motion, at trace time: the body's nodes that only
    read its consts are emitted once, in the current trace, on `consts`, and
    the values the rest of the body reads from them become new consts.

    Returns `(body, consts)`, the new body (with its consts first, as ever)
    and the operands to pass for them. An implicit time step whose matrix
    does not change across steps so factors it once per loop, not per step.
    (The `hoist` pass does the same on a finished graph.)
    """
    split = split_invariant(graph, num_consts)
    if split is None:
        return graph, list(consts)
    inv_nodes, needed, body = split
    sub = Graph(graph.inputs[:num_consts], tuple(inv_nodes), tuple(needed),
                f"{graph.name}_invariant")
    return body, list(consts) + inline(sub, list(consts))


def hoist_nodes(graph: Graph, num_consts: int, const_atoms: Sequence):
    """Loop-invariant code motion on a finished graph: `(outer_nodes,
    new_atoms, body)`, the invariant nodes re-made to read `const_atoms`
    (the node's operands) with fresh output `Var`s, the atoms to pass for
    the new consts, and the new body; None if nothing is invariant."""
    split = split_invariant(graph, num_consts)
    if split is None:
        return None
    inv_nodes, needed, body = split
    env: dict[Var, object] = dict(zip(graph.inputs[:num_consts], const_atoms))
    outer = []
    for n in inv_nodes:
        outs = tuple(Var(v.type, v.hint) for v in n.outputs)
        env.update(zip(n.outputs, outs))
        outer.append(n.replace(inputs=tuple(env.get(a, a) if isinstance(a, Var) else a
                                            for a in n.inputs), outputs=outs))
    return outer, [env[v] for v in needed], body


def with_consts(graph: Graph, types) -> Graph:
    """`graph` with unused inputs of `types` after its consts (new consts of a
    `Body`, which then counts them)."""
    nc = graph.num_consts if isinstance(graph, Body) else 0
    new = tuple(Var(t) for t in types)
    out = graph.replace(inputs=graph.inputs[:nc] + new + graph.inputs[nc:])
    if isinstance(out, Body):
        out = out.replace(num_consts=nc + len(new))
    return out


def hoist_rule(node: Node, *, also: Sequence[str] = ()):
    """The `def_hoist` rule of a loop node whose `body` param is a `Body` and
    whose operands start with its consts: the body's loop-invariant nodes
    move out of the loop (`hoist_nodes`), the values the rest reads become
    new consts, and the bodies named in `also` (a `while` loop's predicate,
    which reads the same operands) get them as unused consts.
    Returns `(outer_nodes, node)`, or None if nothing is invariant."""
    body = node.params["body"]
    nc = body.num_consts
    res = hoist_nodes(body, nc, node.inputs[:nc])
    if res is None:
        return None
    outer, atoms, body = res
    params = dict(node.params, body=body)
    for name in also:
        params[name] = with_consts(node.params[name], [a.type for a in atoms])
    return outer, node.replace(inputs=node.inputs[:nc] + tuple(atoms) + node.inputs[nc:],
                               params=params)


def nonlinear_body(graph: Graph, linear: Sequence[bool], outputs: Sequence[int], *,
                   name: str) -> Graph:
    """The part of `graph` that computes its `outputs` (indices), which must
    not depend on its inputs flagged `linear`: a graph of its other inputs
    (the primal part of a loop body in a tangent map)."""
    from ._autodiff import emit_nonlinear, is_linear

    types = [v.type for v, f in zip(graph.inputs, linear) if not f]

    def fn(*values):
        outs = emit_nonlinear(graph, linear, values)
        assert not any(is_linear(outs[i]) for i in outputs), \
            f"nonlinear_body: an output of {graph.name} depends on the linear inputs"
        return [outs[i] for i in outputs]

    g, consts, _ = trace_body(fn, types, name=name)
    assert not consts, "a body's nonlinear part closes over nothing"
    return g


def transpose_body(graph: Graph, linear: Sequence[bool], given: Sequence[bool], *,
                   name: str) -> Graph:
    """The transpose of a body linear in its inputs flagged `linear`:
    `(*others, *cts) -> (*linear_cts)`, with `others` its other inputs in
    order, `cts` the cotangents of its outputs flagged `given` (the rest
    have none) and a cotangent per linear input, zeros where it gets none.
    The nonlinear nodes it needs are emitted in it again (the primal part of
    a loop step, recomputed in the transposed step)."""
    from ._autodiff import Zero, instantiate, transpose_eval

    others = [v.type for v, f in zip(graph.inputs, linear) if not f]
    ct_types = [a.type.update() for a, g in zip(graph.outputs, given) if g]
    n = len(others)

    def fn(*args):
        it = iter(args[n:])
        cts = [next(it) if g else Zero(a.type.update())
               for a, g in zip(graph.outputs, given)]
        lin_cts = transpose_eval(graph, linear, args[:n], cts)
        return [instantiate(c) for c in lin_cts]

    g, consts, _ = trace_body(fn, others + ct_types, name=name)
    assert not consts, "a body's transpose closes over nothing"
    return g


def applied_linearity_rule(*names: str, skip: int = 0):
    """The `def_linearity` rule of a node that applies its bodies (the params
    `names`) once to its operands after `skip` leading ones that are never
    linear (`cond`'s predicate): an output depends on the linear operands
    where it does in any body (`graph_linear_outputs`)."""
    from ._autodiff import graph_linear_outputs

    def rule(linear, **params):
        out = None
        for name in names:
            lin = graph_linear_outputs(params[name], list(linear[skip:]))
            out = lin if out is None else [a or b for a, b in zip(out, lin)]
        return out

    return rule


def applied_transpose_rule(prim, *names: str, skip: int = 0):
    """The `def_transpose` rule of a node that applies its bodies (the params
    `names`) once to its operands after `skip` leading ones that are never
    linear (`cond`'s predicate): the same node on the bodies' transposes
    (`transpose_body`), reading the non-linear operands and the given
    cotangents; its outputs are the linear operands' cotangents."""
    from ._autodiff import is_linear, is_zero

    def rule(cts, *args, **params):
        lead, operands = args[:skip], args[skip:]
        linear = [is_linear(a) for a in operands]
        given = [not is_zero(c) for c in cts]
        bodies = {name: applied_body(transpose_body(params[name], linear, given,
                                                    name=f"{params[name].name}_transpose"))
                  for name in names}
        out = iter(prim.bind(*lead, *[a for a, f in zip(operands, linear) if not f],
                             *[c for c, g in zip(cts, given) if g], **dict(params, **bodies)))
        return (None,) * skip + tuple(next(out) if f else None for f in linear)

    return rule

