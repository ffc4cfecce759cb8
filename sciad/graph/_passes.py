"""Graph-to-graph passes: `dce`, `cse`, `fold_constants`, `simplify`,
`share_factors`, `hoist`, `place_releases`, `optimize`.

Every pass has the shape `def dce(graph: Graph) -> Graph`. It builds a new graph
and never changes its input; it keeps `graph.inputs` (the same `Var`s, in the same
order), the number and order of outputs and their types, and the `source` of every
node it keeps. Subgraphs held in params (`call[graph=...]`) get the same pass, with
their own inputs and outputs left as they are. With `sciad.config.enable_checks`
on, the result is verified.

A pass that replaces a value by another atom records it in a substitution, a dict
`Var -> Atom`, and `_subst` applies it to later nodes' inputs and to the outputs.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from .. import config
from ..config import x64_scope
from ..errors import RuleError
from ._core import Atom, Graph, Literal, Node, Var, _graphs_in, has_effects, must_run
from ._types import TensorType, holds_tuple
from ._verify import verify

_Run = Callable[[Graph], Graph]

# --------------------------------------------------------------------------
# Shared machinery


def _subst(atoms: Iterable[Atom], env: dict[Var, Atom]) -> tuple[Atom, ...]:
    """`atoms` with every `Var` that `env` replaces replaced.

    Values put into `env` are already substituted, so one lookup is enough.
    """
    return tuple(env.get(a, a) if isinstance(a, Var) else a for a in atoms)


def _same(xs: Iterable, ys: Iterable) -> bool:
    xs, ys = tuple(xs), tuple(ys)
    return len(xs) == len(ys) and all(x is y for x, y in zip(xs, ys))


def _with_inputs(node: Node, inputs: tuple[Atom, ...]) -> Node:
    return node if _same(inputs, node.inputs) else node.replace(inputs=inputs)


def _rebuild(graph: Graph, nodes: list[Node], outputs: tuple[Atom, ...]) -> Graph:
    """`graph` itself if nothing changed, so unchanged subgraphs keep their identity
    (and `cse` can still merge two calls of one body)."""
    if _same(nodes, graph.nodes) and _same(outputs, graph.outputs):
        return graph
    return graph.replace(nodes=tuple(nodes), outputs=outputs)


def _memo(pass_fn: Callable[[Graph, _Run], Graph]) -> _Run:
    """`pass_fn` run once per distinct graph object: a body shared by two nodes
    becomes one shared new body."""
    cache: dict[int, tuple[Graph, Graph]] = {}

    def run(graph: Graph) -> Graph:
        hit = cache.get(id(graph))
        if hit is None:
            out = pass_fn(graph, run)
            _check_interface(graph, out)
            # holding `graph` keeps it alive, so its id is not reused
            hit = cache[id(graph)] = (graph, out)
        return hit[1]

    return run


def _check_interface(old: Graph, new: Graph) -> None:
    assert _same(new.inputs, old.inputs), \
        f"a pass changed the inputs of graph {old.name!r}; this is a bug in sciad."
    assert new.out_types == old.out_types, (
        f"a pass changed the output types of graph {old.name!r} from "
        f"{[t.str_short() for t in old.out_types]} to "
        f"{[t.str_short() for t in new.out_types]}; this is a bug in sciad.")


def _map_param(value, run: _Run):
    if isinstance(value, Graph):
        return run(value)
    if isinstance(value, tuple):
        new = tuple(_map_param(v, run) for v in value)
        return value if _same(new, value) else new
    return value


def _map_subgraphs(node: Node, run: _Run) -> Node:
    """`node` with `run` applied to every graph in its params."""
    if not node.subgraphs:
        return node
    params = {k: _map_param(v, run) for k, v in node.params.items()}
    if all(params[k] is v for k, v in node.params.items()):
        return node
    return node.replace(params=params)


def _forward(graph: Graph, run: _Run, visit: Callable[[Node], Node | tuple]) -> Graph:
    """Walks the nodes in order. Each node, with its inputs substituted and its
    subgraphs rewritten, goes to `visit`, which returns the node to keep (maybe a
    new one with the same outputs) or a tuple of atoms that replace its outputs."""
    env: dict[Var, Atom] = {}
    nodes: list[Node] = []
    for node in graph.nodes:
        node = _map_subgraphs(_with_inputs(node, _subst(node.inputs, env)), run)
        out = visit(node)
        if isinstance(out, Node):
            assert _same(out.outputs, node.outputs), "a rewrite must keep the outputs"
            nodes.append(out)
        else:
            assert len(out) == len(node.outputs)
            env.update(zip(node.outputs, out))
    return _rebuild(graph, nodes, _subst(graph.outputs, env))


def _finish(graph: Graph, out: Graph) -> Graph:
    if out is graph:
        out = graph.replace()
    if config.enable_checks:
        verify(out)
    return out


# --------------------------------------------------------------------------
# dce


def dce(graph: Graph) -> Graph:
    """Dead-code elimination: drops the nodes whose results the outputs do not need.

    A node is kept if one of its outputs is used, directly or through other kept
    nodes, by `graph.outputs`, or if it must run whether or not it is used
    (`must_run`): it has effects (`node.effects`, or effects of a node in one
    of its subgraphs), or it checks its values when it runs and may raise (a
    solve, a bounded loop, a guard: `Primitive(runtime_checks=True)`, or such
    a node in a subgraph). So a program derived from one that fails (a
    gradient that needs none of a failed solve's results, say) fails too. A
    node with several outputs is kept or dropped whole, except that a node
    with a body drops its unused outputs through its `dce` rule. Subgraphs
    are cleaned too; their inputs and outputs stay.

    **Arguments:**

    - `graph`: the graph to clean. It is not changed.

    **Returns:**

    A new `Graph` with the same inputs and outputs and the kept nodes in their
    original order.
    """
    return _finish(graph, _memo(_dce_graph)(graph))


def _dce_graph(graph: Graph, run: _Run) -> Graph:
    live = {a for a in graph.outputs if isinstance(a, Var)}
    kept: list[Node] = []
    for node in reversed(graph.nodes):
        used = [v in live for v in node.outputs]
        if any(used) or must_run(node):
            node = _map_subgraphs(node, run)
            rule = node.primitive.dce_rule
            if rule is not None and any(used) and not has_effects(node):
                # a node with a body drops its unused outputs (and what only
                # they needed, inside the body and among its operands)
                new = rule(node, used)
                if new is not None:
                    assert all(v in node.outputs for v in new.outputs), \
                        f"{node.primitive.name}: a dce rule must keep output Vars"
                    node = new
            kept.append(node)
            live.update(a for a in node.inputs if isinstance(a, Var))
    kept.reverse()
    return _rebuild(graph, kept, graph.outputs)


# --------------------------------------------------------------------------
# cse


def cse(graph: Graph) -> Graph:
    """Common-subexpression elimination: computes each distinct expression once.

    Two nodes are merged when they apply the same primitive to the same operands
    (the same `Var`s, or `Literal`s of equal dtype, shape and bytes) with equal
    params; a `Graph` param compares by identity, and floats compare by their
    exact value, so `0.0` and `-0.0` differ. The later node is dropped and its
    uses read the first node's outputs. Nodes with effects are never merged.
    Subgraphs are processed first, so two calls of one body still merge.

    **Arguments:**

    - `graph`: the graph to rewrite. It is not changed.

    **Returns:**

    A new `Graph` with the same inputs and outputs.
    """
    return _finish(graph, _memo(_cse_graph)(graph))


def merge_duplicates(graph: Graph) -> Graph:
    """`cse` of `graph`'s own nodes, for the transforms: its subgraphs are
    left as they are (a transform that differentiates a body merges that
    body's duplicates when it gets to it), and `graph` itself comes back
    when nothing merges.

    Differentiation runs it first, so that a value computed twice (two
    `eigvalsh(A)` of one matrix, or of two equal `A @ A.T`) is one node and
    gets the sum of its uses' cotangents: a check on the cotangents a node
    receives (the gauge guard of `linalg.eigh` and `linalg.svd`) judges
    the derivative of the whole function, not of each use apart, which
    alone may have none (`eigvalsh(A)[1] + eigvalsh(A)[2]` at `w_1 = w_2`
    is differentiable; each term is not).
    """
    return _cse_graph(graph, lambda g: g)


def _param_key(v):
    """A hashable key under which two params are equal only if they mean the same:
    `1`, `1.0` and `True` differ, and so do `0.0` and `-0.0`."""
    if isinstance(v, Graph):
        return v  # identity
    if isinstance(v, tuple):
        return (tuple, tuple(_param_key(x) for x in v))
    if isinstance(v, frozenset):
        return (frozenset, frozenset(_param_key(x) for x in v))
    if isinstance(v, np.generic):
        return (type(v), v.tobytes())
    if isinstance(v, (float, complex)):
        return (type(v), repr(v))
    return (type(v), v)


class _LiteralKey:
    """A dict key under which two constants are equal only if their types and
    bytes are (so `0.0` and `-0.0` differ): hashed from the type and a
    sample of the values, compared in full on a hash match, without copying."""

    __slots__ = ("lit", "_bytes", "_hash")

    def __init__(self, lit: Literal):
        v = np.ascontiguousarray(lit.value)
        flat = v.reshape(-1)
        self.lit = lit
        self._bytes = flat.view(np.uint8)
        sample = flat[np.linspace(0, flat.size - 1, min(flat.size, 64)).astype(np.intp)] \
            if flat.size else flat
        self._hash = hash((lit.type, v.dtype.str, v.shape, sample.tobytes()))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return (isinstance(other, _LiteralKey) and self._hash == other._hash
                and self.lit.type == other.lit.type
                and self.lit.value.dtype == other.lit.value.dtype
                and self.lit.value.shape == other.lit.value.shape
                and np.array_equal(self._bytes, other._bytes))


def literal_key(lit: Literal) -> "_LiteralKey":
    """A dict key under which two constants are equal only if their types and
    bytes are (the lowering shares one JAX value among equal large ones)."""
    return _LiteralKey(lit)


def _atom_key(a: Atom):
    if isinstance(a, Var):
        return a
    value = a.value
    if value.size <= 16:
        return (Literal, a.type, value.dtype.str, value.shape, value.tobytes())
    return _LiteralKey(a)


def _cse_graph(graph: Graph, run: _Run) -> Graph:
    seen: dict[tuple, tuple[Var, ...]] = {}

    def visit(node: Node):
        if has_effects(node):
            return node
        try:
            key = (node.primitive, tuple(_atom_key(a) for a in node.inputs),
                   tuple(sorted(((k, _param_key(v)) for k, v in node.params.items()),
                                key=lambda kv: kv[0])),
                   tuple(v.type for v in node.outputs))
            first = seen.get(key)
        except TypeError:  # an unhashable param: never merged
            return node
        if first is not None:
            return first
        seen[key] = node.outputs
        return node

    return _forward(graph, run, visit)


# --------------------------------------------------------------------------
# fold_constants


def fold_constants(graph: Graph, max_size: int = 1024) -> Graph:
    """Evaluates the nodes whose operands are all constants; their results become
    `Literal`s.

    A node is folded if every operand is a `Literal` (or it has none, like `full`,
    `eye` or `arange`), it has no effects and no subgraph params, and each output
    is a `TensorType` (without structure tags) of at most `max_size` elements.
    It is run on the host by its primitive's implementation, as lowering would
    run it, with 64-bit dtypes on; the outputs become `Literal`s of exactly the
    node's output dtype and shape. Chains fold in one pass, since a folded
    result is a constant operand for the nodes after it. A node whose
    implementation raises, or returns another dtype or shape, is kept as it is.
    Graph outputs may become `Literal`s.

    **Arguments:**

    - `graph`: the graph to fold. It is not changed.
    - `max_size`: the largest output (in elements) to store as a constant; larger
        ones stay as nodes, which keeps the graph small and its text readable.

    **Returns:**

    A new `Graph` with the same inputs and output types.
    """
    return _finish(graph, _memo(lambda g, run: _fold_graph(g, run, max_size))(graph))


def _foldable(node: Node, max_size: int) -> bool:
    return (node.primitive.impl_rule is not None
            and all(isinstance(a, Literal) for a in node.inputs)
            and not has_effects(node) and not node.subgraphs
            and all(isinstance(v.type, TensorType) and not v.type.tags
                    and v.type.size <= max_size for v in node.outputs))


def _evaluate_node(node: Node) -> tuple[Literal, ...] | None:
    """The node's outputs as `Literal`s, or None if it cannot be evaluated exactly."""
    prim = node.primitive
    try:
        with x64_scope():
            out = prim.impl_rule(*(a.value for a in node.inputs), **node.params)
            outs = tuple(out) if prim.multiple_results else (out,)
            values = [np.array(o, copy=True) for o in outs]
    except Exception:  # a failing op stays in the graph, to fail where it runs
        return None
    if len(values) != len(node.outputs):
        return None
    lits = []
    for v, value in zip(node.outputs, values):
        if value.shape != v.type.shape or value.dtype != v.type.dtype:
            return None
        lits.append(Literal(value))
    return tuple(lits)


def _fold_graph(graph: Graph, run: _Run, max_size: int) -> Graph:
    def visit(node: Node):
        if _foldable(node, max_size):
            lits = _evaluate_node(node)
            if lits is not None:
                return lits
        return node

    return _forward(graph, run, visit)


# --------------------------------------------------------------------------
# simplify


def simplify(graph: Graph) -> Graph:
    """Algebraic simplification: rewrites that give exactly the same values.

    - `mul(x, 1)`, `mul(1, x)`, `div(x, 1)` -> `x`, for real and integer `x`;
    - `add(x, 0)`, `add(0, x)`, `sub(x, 0)` -> `x`;
    - `neg(neg(x))`, `conj(conj(x))` -> `x`;
    - `pow(x, 1)` -> `x` for real `x`; `select(c, x, y)` with a constant
        condition `c` (all true, or all false) -> `x` (or `y`);
    - `transpose(transpose(x, p1), p2)` -> `transpose(x, p1[p2])`, and a transpose
        by the identity permutation -> `x`;
    - `reshape(reshape(x, s1), s2)` -> `reshape(x, s2)`, and a reshape to `x`'s
        own shape -> `x`;
    - `broadcast_to` to `x`'s own shape, `convert` to `x`'s own dtype -> `x`;
    - a Fourier transform applied to its inverse (`ifft(fft(x))`,
        `irfft(rfft(x))`, with the same axes, lengths and norm) -> `x`, and so
        the pairs that reverse mode creates from them. These are identities
        of exact arithmetic: the folded graph skips the transforms' rounding
        (about 1e-16 relative), the one place where this pass changes values.

    Each rewrite is its primitive's `def_simplify` rule, defined beside the
    op (the ones above are the built-in ops' rules), and a user primitive
    takes part the same way: a rule `fn(node, producer)` gets the node and
    `producer(atom)` (the node that computes an operand, or None) and
    returns the value that replaces the node's output, a new node computing
    it, or None. A replacement must have exactly the output's type.

    "1" and "0" are `Literal`s whose every element is 1 (or 0), or outputs of a
    `full` node with that value. A rewrite is made only if the replaced value has
    exactly `x`'s type (dtype, shape and tags): `x * ones((2, 3))` with `x` of
    shape `(3,)` is kept, since the product is bigger than `x`.

    Left alone on purpose:

    - `x * 0` -> `0`: it is NaN where `x` is NaN or infinite.
    - complex `x * 1` and `x / 1`: complex arithmetic computes `b * 0` for the
        imaginary part of `1`, which is NaN for an infinite `b` and can flip the
        sign of a zero.

    One exception to exactness is accepted, as compilers (XLA's algebraic
    simplifier among them) do: `add(x, 0)` -> `x` keeps a `-0.0` in `x` where
    `-0.0 + 0.0` gives `+0.0`. The two compare equal.

    The rewrites run to a fixed point, then `dce` removes what they left unused.

    **Arguments:**

    - `graph`: the graph to simplify. It is not changed.

    **Returns:**

    A new `Graph` with the same inputs and output types.
    """
    run = _memo(_simplify_graph)
    return _finish(graph, _memo(_dce_graph)(run(graph)))


def _rewrite(node: Node, producer: dict[Var, Node]) -> Atom | Node | None:
    """One rewrite of `node` by its primitive's simplify rule: an atom that
    replaces its output, a new node with the same output, or None."""
    rule = node.primitive.simplify_rule
    if rule is None or len(node.outputs) != 1:
        return None
    return _checked_rewrite(node, rule(node, producer.get))


def _checked_rewrite(node: Node, new) -> Atom | Node | None:
    """A primitive's own simplify rule's result, checked: a replacement must
    have exactly the type of the value it replaces."""
    out = node.outputs[0]
    if new is None or new is node:
        return None
    if isinstance(new, Node):
        if tuple(v.type for v in new.outputs) != (out.type,):
            raise RuleError(f"the simplify rule returned a node with outputs "
                            f"{[v.type.str_short() for v in new.outputs]} for "
                            f"{out.type.str_short()}.", op=node.primitive.name,
                            source=node.source)
        return new.replace(outputs=node.outputs) if new.outputs != node.outputs else new
    if not isinstance(new, (Var, Literal)) or new.type != out.type:
        got = new.type.str_short() if isinstance(new, (Var, Literal)) else repr(new)
        raise RuleError(f"the simplify rule must return a value of type "
                        f"{out.type.str_short()} (or a node, or None), got {got}.",
                        op=node.primitive.name, source=node.source)
    return new


def _simplify_graph(graph: Graph, run: _Run) -> Graph:
    for _ in range(100):  # each round only shortens chains; a few rounds suffice
        producer: dict[Var, Node] = {}

        def visit(node: Node):
            new = _rewrite(node, producer)
            if new is None:
                new = node
            if isinstance(new, Node):
                producer.update((v, new) for v in new.outputs)
                return new
            return (new,)

        new_graph = _forward(graph, run, visit)
        if new_graph is graph:
            break
        graph = new_graph
    return graph


# --------------------------------------------------------------------------
# share_factors


def share_factors(graph: Graph) -> Graph:
    """One factorization per matrix: direct solves become factor + backsolve.

    A node whose primitive declares the `factored` trait, and whose params it
    accepts, is replaced by a node reading a factorization of its first
    operand: every `linalg.solve` with a direct solver (`lu`, `cholesky`,
    `splu`, ...) by a `linalg.backsolve(F, a, b)` reading a
    `linalg.factor(a) -> F` node, and every 1-norm `linalg.rcond` estimate by
    a `linalg.factor_rcond(F, a)`. All of them with the same matrix operand
    (the same `Var`, or equal constants) and factor params (the solver, the
    pattern) share that one factor, placed before the first of them. Run
    after differentiation (the adjoint's transposed solves are then in the
    graph), as `optimize` does; a backsolve keeps the matrix operand, so its
    derivative rules are the solve's and the graph can still be
    differentiated.

    Each factor node's params are then set from its readers by its
    primitive's `fit_to_readers` trait: for `linalg.factor`, `assume` the
    strongest structure a solve relies on, `throw=False` if no reader raises
    (a `throw=False` solve, a condition estimate), and `uses`, the number of
    nodes reading it, where the program that makes the factorization ends
    it: for one held on the host (`splu`) the last reader releases it (None
    where the factor is a graph output or read by a node whose primitive
    does not declare `reads_factor`: it is then kept until the host store's
    bound pushes it out); a compiled one's handles are made only then, and
    ended by the release `place_releases` puts after its last reader.

    **Arguments:**

    - `graph`: the graph to rewrite. It is not changed.

    **Returns:**

    A new `Graph` with the same inputs and outputs.
    """
    return _finish(graph, _memo(_share_factors_graph)(graph))


def _share_factors_graph(graph: Graph, run: _Run) -> Graph:
    factors: dict[tuple, Var] = {}
    new_nodes: list[Node] = []
    for node in graph.nodes:
        # (a node that reads a shared factor is rewritten whole: a `map` of
        # one solve becomes a map of a backsolve, not a map of its own factor)
        factored = node.primitive.factored
        how = factored(node.params) if factored is not None else None
        if how is None:
            new_nodes.append(_map_subgraphs(node, run))
            continue
        a, fparams = node.inputs[0], dict(how.factor_params)
        key = (how.factor, _atom_key(a), tuple(sorted(fparams.items())))
        f = factors.get(key)
        if f is None:
            (ftype,) = how.factor.abstract_eval(a.type, **fparams)
            f = factors[key] = Var(ftype)
            new_nodes.append(Node(how.factor, (a,), (f,), fparams, frozenset(), node.source))
        new_nodes.append(Node(how.reader, (f, *node.inputs), node.outputs,
                              dict(how.reader_params), node.effects, node.source))
    return _rebuild(graph, _fit_factors(new_nodes, graph.outputs), graph.outputs)


def _fit_factors(nodes: list[Node], outputs) -> list[Node]:
    """The factor nodes' params from their readers (`fit_to_readers`)."""
    readers: dict[Var, list[Node]] = {}
    for node in nodes:
        for a in node.inputs:
            if isinstance(a, Var) and holds_tuple(a.type):  # a factor, or a batch of them
                readers.setdefault(a, []).append(node)
    escaping = {a for a in outputs if isinstance(a, Var)}
    out = []
    for node in nodes:
        fit = node.primitive.fit_to_readers
        if fit is None:
            out.append(node)
            continue
        # the factorization: the node's first output that is one
        f = next((v for v in node.outputs if holds_tuple(v.type)), node.outputs[0])
        users = readers.get(f, [])
        escapes = f in escaping
        complete = not escapes and all(u.primitive.reads_factor for u in users)
        params = dict(fit(node.params, users, complete, escapes))
        out.append(node if params == dict(node.params) else node.replace(params=params))
    return out


# --------------------------------------------------------------------------
# hoist


def hoist(graph: Graph) -> Graph:
    """Loop-invariant code motion: the nodes of a loop's body that read only
    the loop's consts (the same values at every step) move out of the loop
    and run once before it; the body reads their results as consts.

    Each loop primitive says how with its `def_hoist` rule. After
    differentiation and `share_factors` this moves the factorization of a
    matrix that does not change across an implicit time loop out of the loop
    (and out of its adjoint loop), so the matrix is factored once per solve
    of the whole loop, not once per step. Nodes with effects stay.

    **Arguments:**

    - `graph`: the graph to rewrite. It is not changed.

    **Returns:**

    A new `Graph` with the same inputs and outputs.
    """
    return _finish(graph, _memo(_hoist_graph)(graph))


def _hoist_graph(graph: Graph, run: _Run) -> Graph:
    nodes: list[Node] = []
    for node in graph.nodes:
        node = _map_subgraphs(node, run)
        rule = node.primitive.hoist_rule
        res = rule(node) if rule is not None and not node.effects else None
        if res is None:
            nodes.append(node)
            continue
        outer, new = res
        nodes.extend(outer)
        nodes.append(new)
    return _rebuild(graph, nodes, graph.outputs)


# --------------------------------------------------------------------------
# place_releases


def place_releases(graph: Graph, hold: bool = True) -> Graph:
    """Ends what the program makes: after the last node reading a value that
    holds something the running program made (a compiled factorization's
    handles: its primitive's `holds` trait says so, and how it is ended), a
    release node (`Holding.release`, a primitive declared `releases=True`)
    reading the value and every output of its readers, so it runs after
    them. In every subgraph too. A held value that is an output of its
    graph is left to the node lowering that graph (a `map` whose body makes
    a factorization holds the batch of them in the enclosing graph). Release
    nodes already in the graph are placed again, so the pass can run twice.

    Run last (`optimize` does): a later pass that moved a reader (`hoist`)
    would leave a release behind it. Lowering then needs no bookkeeping of
    its own: the graph says where every made value ends, and, for a check
    that fails while the program runs, which values are live
    (`sciad.graph._lower`).

    **Arguments:**

    - `graph`: the graph to rewrite. It is not changed.
    - `hold`: False for a program XLA partitions over devices (its inputs
      laid over several): there a release, a call with a side effect, has
      no sharding, so nothing is held (`Holding.without`: each compiled
      solve factors in its own call) and no release is placed.

    **Returns:**

    A new `Graph` with the same inputs and outputs.

    ```python
    g = sd.graph.passes.optimize(sd.trace(sd.grad(loss), m))   # places them last
    [n for n in g.nodes if n.primitive.releases]
    # [() = linalg.release[solver='klu'] !{release} %1, %2, %6 : ()]  (a KLU factor
    # read by the solve and the adjoint's transposed solve, released after both)
    ```
    """
    if not hold:
        return _finish(graph, _memo(_unhold_graph)(graph))
    return _finish(graph, _memo(_place_releases_graph)(graph))


def _has_releases(graph: Graph) -> bool:
    # (the params' graphs unsorted: `Node.subgraphs` sorts, which costs more
    # than the walk)
    return any(n.primitive.releases or (n.params and any(
        _has_releases(g) for g in _graphs_in(n.params.values()))) for n in graph.nodes)


def _strip_releases(graph: Graph) -> Graph:
    """`graph` without its release nodes (in subgraphs too)."""
    if not _has_releases(graph):
        return graph

    def strip(g: Graph, run: _Run) -> Graph:
        nodes = [_map_subgraphs(n, run) for n in g.nodes if not n.primitive.releases]
        return _rebuild(g, nodes, g.outputs)

    return _memo(strip)(graph)


def _holding(node: Node):
    """`node`'s `Holding` where its value is ended by a release node."""
    holds = node.primitive.holds
    held = holds(node.params) if holds is not None else None
    return held if held is not None and held.release is not None else None


def _place_releases_graph(graph: Graph, run: _Run) -> Graph:
    nodes = [_map_subgraphs(n, run) for n in graph.nodes if not n.primitive.releases]
    escaping = {a for a in graph.outputs if isinstance(a, Var)}
    holding = {}
    for i, node in enumerate(nodes):
        held = _holding(node)
        if held is not None and node.outputs[0] not in escaping:
            holding[node.outputs[0]] = (i, held)
    if not holding:
        return _rebuild(graph, nodes, graph.outputs)
    readers: dict[Var, list[int]] = {f: [] for f in holding}
    for i, node in enumerate(nodes):
        for a in node.inputs:
            if a in readers and (not readers[a] or readers[a][-1] != i):
                readers[a].append(i)
    placed: dict[int, list[Node]] = {}
    for f, (i, held) in holding.items():
        users = readers[f]
        after = tuple(v for j in users for v in nodes[j].outputs)
        release = Node(held.release, (f, *after), (), dict(held.release_params),
                       frozenset({"release"}), nodes[i].source)
        placed.setdefault(max(users, default=i), []).append(release)
    out: list[Node] = []
    for i, node in enumerate(nodes):
        out.append(node)
        out.extend(placed.get(i, ()))
    return _rebuild(graph, out, graph.outputs)


def _unhold_graph(graph: Graph, run: _Run) -> Graph:
    nodes = []
    for node in graph.nodes:
        if node.primitive.releases:
            continue
        node = _map_subgraphs(node, run)
        held = _holding(node)
        if held is not None:
            node = node.replace(params=dict(held.without))
        nodes.append(node)
    return _rebuild(graph, nodes, graph.outputs)


# --------------------------------------------------------------------------
# optimize


def optimize(graph: Graph, max_rounds: int = 10) -> Graph:
    """`simplify`, `fold_constants`, `cse`, `share_factors`, `hoist` and `dce`,
    repeated until the graph stops changing, then `place_releases`.

    One pass can open work for another (a folded constant may be a `1` that
    `simplify` removes; a simplified expression may duplicate another), so the
    four run in rounds until a round leaves every node as it was, or
    `max_rounds` have run. The releases of what the program makes are placed
    once the nodes stay where they are (those of a graph optimized before
    are taken out first).

    **Arguments:**

    - `graph`: the graph to optimize. It is not changed.
    - `max_rounds`: the most rounds to run.

    **Returns:**

    A new `Graph` with the same inputs and output types.
    """
    graph = _strip_releases(graph)
    for _ in range(max_rounds):
        new = dce(hoist(share_factors(cse(fold_constants(simplify(graph))))))
        # the passes keep a node object they do not change (and its subgraphs)
        done = _same(new.nodes, graph.nodes) and _same(new.outputs, graph.outputs)
        graph = new
        if done:
            break
    placed = _memo(_place_releases_graph)(graph)  # (verified as the rounds' last pass was)
    return graph if placed is graph else _finish(graph, placed)
