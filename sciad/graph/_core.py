"""The IR: `Var`, `Literal`, `Node`, `Graph`, and `Primitive` with its registry.

A `Graph` is plain data: its inputs (`Var`s), its nodes in topological order,
and its outputs (`Var`s or `Literal`s). A `Node` applies one `Primitive` to
input atoms with static, hashable `params`; a param may itself be a `Graph`
(the body of a higher-order op). Every rule of a primitive is stored on the
`Primitive` object.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, NamedTuple

import numpy as np

from .._traceback import api_boundary
from ..errors import MissingRuleError, RegistrationError
from ._params import Param, as_declaration, param_problem
from ._source import SourceInfo, user_source
from ._types import AbstractType, TensorType, runtime_type

_var_ids = itertools.count()


class Var:
    """An SSA value: defined once (as a graph input or a node output), typed.

    Identity is object identity; the printer assigns names. `hint` is an
    optional readable name (a function argument's name) the printer may use.
    """

    __slots__ = ("type", "hint", "_id")

    def __init__(self, type: AbstractType, hint: str | None = None):
        self.type = type
        self.hint = hint
        self._id = next(_var_ids)

    def __repr__(self) -> str:
        return f"Var({self.type.str_short()}, id={self._id})"


class Literal:
    """A constant operand: a NumPy array and its type.

    The type is the array's `TensorType`, or a given type whose run-time
    value is that array (a constant sparse matrix: its `SparseType`, with
    `value` its data vector).
    """

    __slots__ = ("value", "type", "_fingerprint")

    def __init__(self, value, type: AbstractType | None = None):
        value = np.asarray(value)
        if value.flags.writeable:  # constants are immutable: copy once, freeze
            value = value.copy()
            value.setflags(write=False)
        self.value = value
        if type is None:
            type = TensorType(value.shape, value.dtype)
        else:
            rt = runtime_type(type)
            assert rt is not None and rt.shape == value.shape and rt.dtype == value.dtype, \
                f"Literal: a {type.str_short()} needs a {rt} array, got {value.dtype}{value.shape}"
        self.type = type
        self._fingerprint: str | None = None

    def fingerprint(self) -> str:
        """A short content hash, used when a large constant is printed (computed
        once: the value is frozen)."""
        if self._fingerprint is None:
            self._fingerprint = hashlib.blake2b(self.value.tobytes(), digest_size=3).hexdigest()
        return self._fingerprint

    def __repr__(self) -> str:
        return f"Literal({self.value!r})"


Atom = Var | Literal


@dataclass(frozen=True, slots=True, eq=False)
class Node:
    """One application of `primitive`.

    `params` are static and hashable (ints, floats, strings, tuples, dtypes,
    `Graph`s for higher-order ops). `effects` is empty for pure ops.
    `source` is the user's file:line at trace time.
    """

    primitive: "Primitive"
    inputs: tuple[Atom, ...]
    outputs: tuple[Var, ...]
    params: Mapping[str, Any] = field(default_factory=dict)
    effects: frozenset = frozenset()
    source: SourceInfo | None = None

    def replace(self, **kw) -> "Node":
        fields = dict(
            primitive=self.primitive, inputs=self.inputs, outputs=self.outputs,
            params=self.params, effects=self.effects, source=self.source,
        )
        fields.update(kw)
        return Node(**fields)

    @property
    def subgraphs(self) -> tuple["Graph", ...]:
        # in the order of the param names, as printed and stored
        return tuple(_graphs_in(v for _, v in sorted(self.params.items())))

    def __str__(self) -> str:
        from ._print import format_node  # (a cycle: _print imports this module)

        return format_node(self)


def has_effects(node: Node) -> bool:
    """Effects of `node` itself or of any node in its subgraphs."""
    return bool(node.effects) or any(has_effects(n) for g in node.subgraphs
                                     for n in g.nodes)


def can_fail(node: Node) -> bool:
    """Whether running `node` checks its values and may raise: its primitive
    declares `runtime_checks`, or a node in one of its subgraphs does. Such a
    node is kept by dead-code elimination even where nothing reads its
    results, so that a program derived from one that fails fails too."""
    return node.primitive.runtime_checks or any(can_fail(n) for g in node.subgraphs
                                                for n in g.nodes)


def must_run(node: Node) -> bool:
    """Whether `node` runs whether or not its results are used: it has
    effects, it ends what the program made (`releases`), or it can fail
    (`can_fail`)."""
    return node.primitive.releases or has_effects(node) or can_fail(node)


def _graphs_in(values) -> Iterator["Graph"]:
    for v in values:
        if isinstance(v, Graph):
            yield v
        elif isinstance(v, tuple):
            yield from _graphs_in(v)


@dataclass(frozen=True, slots=True, eq=False)
class Graph:
    """A typed SSA graph: `inputs`, topologically ordered `nodes`, `outputs`.

    Print it for the SSA text form; `to_dot()` for Graphviz; `to_json()` and
    `Graph.from_json` for a lossless round trip.
    """

    inputs: tuple[Var, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[Atom, ...]
    name: str = "graph"

    @property
    def in_types(self) -> tuple[AbstractType, ...]:
        return tuple(v.type for v in self.inputs)

    @property
    def out_types(self) -> tuple[AbstractType, ...]:
        return tuple(a.type for a in self.outputs)

    def replace(self, **kw) -> "Graph":
        fields = dict(inputs=self.inputs, nodes=self.nodes, outputs=self.outputs,
                      name=self.name)
        fields.update(kw)
        return Graph(**fields)

    def __str__(self) -> str:
        from ._print import format_graph  # (a cycle: _print imports this module)

        return format_graph(self)

    def pretty(self, *, source: bool = True) -> str:
        """The SSA text; `source=False` leaves out the `# file:line` comments."""
        from ._print import format_graph  # (a cycle: _print imports this module)

        return format_graph(self, source=source)

    def __repr__(self) -> str:
        return (f"<Graph {self.name}: {len(self.inputs)} inputs, {len(self.nodes)} nodes,"
                f" {len(self.outputs)} outputs>")

    def to_dot(self) -> str:
        from ._print import to_dot  # (a cycle: _print imports this module)

        return to_dot(self)

    def to_json(self, *, indent: int | None = None, hash: bool = False) -> str:
        """The graph as JSON text; `hash=True` adds a sha256 content hash that
        `from_json` checks. See `sciad.graph.graph_to_json`."""
        from ._serialize import graph_to_json  # (a cycle: _serialize imports this module)

        return graph_to_json(self, indent=indent, hash=hash)

    @classmethod
    @api_boundary
    def from_json(cls, text: str | bytes, *, max_nodes: int | None = None,
                  max_elements: int | None = None, max_depth: int | None = None,
                  max_bytes: int | None = None, require_hash: bool = False) -> "Graph":
        """Rebuilds and verifies a graph written by `to_json`, within limits on
        its size (None: the defaults). See `sciad.graph.graph_from_json`."""
        from ._serialize import graph_from_json  # (a cycle: _serialize imports this module)

        limits = {k: v for k, v in (("max_nodes", max_nodes),
                                    ("max_elements", max_elements),
                                    ("max_depth", max_depth),
                                    ("max_bytes", max_bytes)) if v is not None}
        return graph_from_json(text, require_hash=require_hash, **limits)

    def verify(self) -> "Graph":
        from ._verify import verify  # (a cycle: _verify imports this module)

        verify(self)
        return self


# --------------------------------------------------------------------------
# Primitives and the registry


_REGISTRY: dict[str, "Primitive"] = {}

_RULES = ("impl", "abstract_eval", "jvp", "vjp", "vjp_fwd", "vjp_bwd", "transpose", "batch",
          "sparsity", "simplify", "dce", "hoist", "linearity", "cost")


class Primitive:
    """An operation of the IR, with every rule it has stored on it.

    Rules are defined with the `def_*` hooks (each method's docstring gives
    what its rule receives and returns, with an example):

    - `def_abstract_eval`: `fn(*in_types, **params) -> out_type(s)`, the
      shape/dtype rule; it raises `ShapeError` / `DTypeError` on bad input.
    - `def_impl`: `fn(*jax_arrays, **params) -> array(s)`, the JAX
      implementation that lowering calls.
    - `def_jvp`: `fn(primals, tangents, **params) -> (out, tangent_out)`;
      `def_vjp`: `fn(primals, out, ct, **params) -> in_cts`;
      `def_transpose`: `fn(ct, *operands, **params) -> in_cts`;
      `def_batch`: `fn(args, dims, **params) -> (out, dim)`: derivative and
      batching rules, written with sciad ops.
    - `def_vjp_fwd`: `fn(primals, **params) -> (out, residuals)` and
      `def_vjp_bwd`: `fn(residuals, ct, **params) -> in_cts`: reverse mode
      in two halves, for a primitive whose backward pass needs values its
      forward pass computes (a loop's per-step residuals). They take
      precedence over `def_vjp`.
    - `def_sparsity`: `fn(out_types, *deps, **params) -> pattern(s)`, the
      Jacobian-sparsity rule (see `sciad.graph.Deps`); a primitive without
      one is taken as dense, with a warning.
    - `def_simplify`: `fn(node, producer) -> Atom | Node | None`, a rewrite
      for the `simplify` pass; `def_dce`: `fn(node, used) -> Node | None`,
      dropping a node's unused outputs (a loop's); `def_hoist`: `fn(node) ->
      (nodes, node) | None`, moving a loop's invariant part out of it;
      `def_cost`: `fn(node, body) -> Cost`, the estimate `sd.cost` reports
    - `def_linearity`: `fn(linear, **params) -> flags` for a node with a
      body: which of its outputs depend on its operands flagged `linear`
      (a loop of a tangent map computes primal carries beside tangent ones;
      transposing the map asks this rule which are which).
      (without one, a node costs a FLOP per output element).

    `p(*args, **params)` (or `p.bind`) adds a node while tracing and runs the
    implementation eagerly otherwise.

    Traits, declared as keyword arguments when the primitive is made and
    read as plain attributes (a transform or pass asks a node's primitive,
    never its name):

    - `runtime_checks=True` declares that the implementation checks its
      values when the program runs (a solve finding its matrix singular):
      lowering then passes it `site=` (a `sciad.primitives.Site`: the node's
      op, source line and text, for its messages, and what the program
      holds so far, `Site.held`; an implementation that declares a `site`
      parameter gets one too, and a node lowering a body passes
      `site.held` on: `lower(body, site.held)`), and `sd.function` waits
      for the results of programs holding such nodes, so that a failed
      check raises from the call that ran it.
    - `factored(params) -> Factored | None`, for a solve-like op: how a node
      with these params computes from a factorization of its first operand
      (the factor primitive and its params, the primitive reading the
      factorization and its params), or None where it does not (an
      iterative solver). `share_factors` then makes one factorization per
      matrix and rewrites every such node to read it.
    - `reads_factor=True` declares that the primitive reads a factorization
      operand and does nothing else with it (a backsolve, a condition
      estimate from a factor), so a factorization whose readers all declare
      it knows all its uses.
    - `checks_cotangents=True` declares a linear map (the identity, say)
      whose transpose checks the cotangents it receives: the gauge guards
      of eigendecompositions, which refuse a loss that depends on the basis
      chosen inside a cluster of repeated eigenvalues. Forward mode has no
      cotangents, so `sd.jvp` (and `hvp`, `jacfwd`) transposes a tangent map
      holding such nodes once, on a fixed random cotangent, and ties the
      result to its own: the checks judge forward mode too.
    - `fit_to_readers(params, readers, complete, escapes) -> params`, for a
      primitive making a factorization that nodes share: the node's params,
      given the nodes that read its result (`complete`: all of them declare
      `reads_factor`, and the factorization is not a graph output;
      `escapes`: it is a graph output). `share_factors` calls it on every
      factorization node (which structure to assume, whether to raise,
      whether the program makes and ends what it holds).
    - `holds(params) -> Holding | None`, for a primitive whose first output,
      with these params, holds something the running program made and must
      end (a compiled factorization's handles): how it is ended (see
      `Holding`). `place_releases` puts the release node after its last
      reader; lowering gives a failing check the host release of every such
      value made so far.
    - `releases=True` declares the primitive that ends such a value (a
      `Holding.release`): it has no outputs, and `place_releases` alone
      places it.

    `params` declares the static params the rules take: a mapping from each
    name to a `Param` (or a bare type spec, for a required param), e.g.
    `{"axes": tuple[int, ...], "transpose": Param(bool, default=False)}`;
    `{}` declares that there are none. `verify` and the graph loader reject
    a node whose params break the declaration (an unknown name, a missing
    required param, a value of another type). Without a declaration
    (`params=None`) any params are accepted.
    """

    def __init__(self, name: str, *, multiple_results: bool = False,
                 runtime_checks: bool = False,
                 factored: Callable[[Mapping[str, Any]], Factored | None] | None = None,
                 reads_factor: bool = False,
                 checks_cotangents: bool = False,
                 fit_to_readers: Callable[..., Mapping[str, Any]] | None = None,
                 holds: Callable[[Mapping[str, Any]], "Holding | None"] | None = None,
                 releases: bool = False,
                 params: Mapping[str, Param | Any] | None = None,
                 register: bool = True, _source: SourceInfo | None = None):
        if not isinstance(name, str) or not name or any(c.isspace() for c in name):
            raise RegistrationError(
                f"a primitive name must be a non-empty string without spaces, got {name!r}.",
                op="primitive")
        self.name = name
        self.multiple_results = bool(multiple_results)
        self.runtime_checks = bool(runtime_checks)
        self.factored = factored
        self.reads_factor = bool(reads_factor)
        self.checks_cotangents = bool(checks_cotangents)
        self.fit_to_readers = fit_to_readers
        self.holds = holds
        self.releases = bool(releases)
        #: the declared params, `{name: Param}`, or None (undeclared: any params)
        self.params: Mapping[str, Param] | None = as_declaration(name, params)
        self.defined_at = _source or _definition_site()
        self.impl_rule: Callable | None = None
        self.abstract_eval_rule: Callable | None = None
        self.jvp_rule: Callable | None = None
        self.vjp_rule: Callable | None = None
        self.transpose_rule: Callable | None = None
        self.batch_rule: Callable | None = None
        self.sparsity_rule: Callable | None = None
        self.simplify_rule: Callable | None = None
        self.vjp_fwd_rule: Callable | None = None
        self.vjp_bwd_rule: Callable | None = None
        self.dce_rule: Callable | None = None
        self.hoist_rule: Callable | None = None
        self.linearity_rule: Callable | None = None
        self.cost_rule: Callable | None = None
        if register:
            _register(self)

    # -- rule decorators ---------------------------------------------------
    def _def(self, rule: str, fn: Callable) -> Callable:
        if not callable(fn):
            raise RegistrationError(f"`def_{rule}` needs a function, got {fn!r}.",
                                    op=self.name)
        if getattr(self, f"{rule}_rule") is not None:
            raise RegistrationError(
                f"the {rule} rule is already defined "
                f"(by {getattr(self, f'{rule}_rule').__qualname__}); "
                "a rule is defined once.", op=self.name)
        setattr(self, f"{rule}_rule", fn)
        return fn

    # Each hook stores a rule and returns it unchanged, so it works as a
    # decorator. The examples run in order (tests/test_primitive.py runs them),
    # with `np`, `jnp`, `sd` and `snp` imported; later ones use `cube_p` of
    # `def_impl`'s.

    def def_impl(self, fn):
        """Defines the implementation: `fn(*arrays, **params) -> array`.

        `fn` receives the operands as JAX arrays (a sparse matrix as the
        array of its stored values, a factorization as its backend's arrays)
        and the params, and returns the result: an array, or a sequence of
        arrays for a primitive with `multiple_results`. Lowering calls it
        inside `jax.jit`, and `p(*arrays)` calls it directly outside a
        trace. A primitive made with `runtime_checks=True` also receives
        `site=` (a `sciad.graph.Site`, for its messages).

        ```python
        cube_p = sd.primitive("doc_cube")
        cube_p.def_abstract_eval(lambda x: x)

        @cube_p.def_impl
        def _cube_impl(x):
            return x * x * x

        sd.function(lambda x: cube_p(x) + 1.0)(np.arange(3.0))  # [1.0, 2.0, 9.0]
        ```
        """
        return self._def("impl", fn)

    def def_abstract_eval(self, fn):
        """Defines the shape rule: `fn(*in_types, **params) -> out_type`.

        `fn` receives each operand's type (`sd.TensorType`, with `.shape`,
        `.dtype` and `.str_short()`; a sparse matrix's `SparseType`) and the
        params, and returns the output's type (a sequence of types for a
        primitive with `multiple_results`). It runs at trace time, so operands
        it cannot take fail there with the op and both types, never inside
        XLA: raise `sciad.errors.ShapeError` or `DTypeError`.

        ```python
        outer_p = sd.primitive("doc_outer")
        outer_p.def_impl(jnp.outer)

        @outer_p.def_abstract_eval
        def _outer_shape(x, y):
            if len(x.shape) != 1 or len(y.shape) != 1:
                raise sd.errors.ShapeError(
                    f"expects two vectors, got {x.str_short()} and {y.str_short()}.",
                    op="doc_outer")
            return sd.TensorType(x.shape + y.shape, x.dtype)

        sd.trace(lambda x, y: outer_p(x, y), np.ones(2), np.ones(3)).out_types[0].shape
        # (2, 3)
        ```
        """
        return self._def("abstract_eval", fn)

    def def_jvp(self, fn):
        """Defines forward mode: `fn(primals, tangents, **params) -> (out,
        tangent_out)`.

        `primals` holds the operands (traced values or constants), `tangents`
        one tangent per operand: a traced value of the operand's shape and
        dtype, or a symbolic `sd.graph.Zero` for an operand not
        differentiated (`sd.graph.is_zero(t)`; integers always). Return the
        output, made with `p(...)` so that it stays one node, and its
        tangent (a `Zero` where it is zero); both are tuples with
        `multiple_results`. Write it with sciad ops (`sciad.numpy`,
        primitives): the tangent is a graph that can be differentiated
        again, and reverse mode, without `def_vjp`, transposes it.

        ```python
        @cube_p.def_jvp
        def _cube_jvp(primals, tangents):
            (x,), (t,) = primals, tangents
            return cube_p(x), 3.0 * x * x * t

        sd.jvp(lambda x: cube_p(x), (2.0,), (1.0,))  # (8.0, 12.0)
        ```
        """
        return self._def("jvp", fn)

    def def_vjp(self, fn):
        """Defines reverse mode: `fn(primals, out, ct, **params) -> in_cts`.

        For an adjoint you know better than the transposed JVP (a solve's,
        a root's). `fn` receives the operands, the output and the output's
        cotangent (`out` and `ct` are tuples with `multiple_results`, where
        an output that takes no cotangent has a `sd.graph.Zero`), and returns
        one cotangent per operand, each with its operand's shape and dtype,
        or None for an operand that takes none: `sd.graph.needs_ct(x)` says
        whether the reverse pass differentiates operand `x` (a constant, or a
        value held fixed, needs none; its cotangent is dropped anyway).
        Written with sciad ops, like the JVP, so it can be differentiated
        again. Without it, reverse mode transposes the JVP rule;
        `def_vjp_fwd`/`def_vjp_bwd` take precedence over it.

        ```python
        @cube_p.def_vjp
        def _cube_vjp(primals, out, ct):
            (x,) = primals
            return (3.0 * x * x * ct,)

        sd.grad(lambda x: cube_p(x))(2.0)  # 12.0
        ```
        """
        return self._def("vjp", fn)

    def def_transpose(self, fn):
        """Defines the transpose of a linear map: `fn(ct, *operands, **params)
        -> in_cts`.

        For a primitive linear in some of its operands (a product in either
        factor, an FFT), so that reverse mode can transpose a JVP that
        applies it to tangents. The operands it is linear in arrive as
        `sd.graph.UndefinedPrimal`s (`sd.graph.is_linear(x)`; they have
        `.shape` and `.dtype`, no value), the others as values; `ct` is the
        output's cotangent (a tuple with `multiple_results`). Return one
        cotangent per operand, None for those it is not linear in.

        ```python
        twice_p = sd.primitive("doc_twice")
        twice_p.def_abstract_eval(lambda x: x)
        twice_p.def_impl(lambda x: 2.0 * x)
        twice_p.def_jvp(lambda primals, tangents: (twice_p(*primals), twice_p(*tangents)))

        @twice_p.def_transpose
        def _twice_transpose(ct, x):
            assert sd.graph.is_linear(x)
            return (twice_p(ct),)

        sd.grad(lambda x: snp.sum(twice_p(x) ** 2))(np.ones(2))  # [8.0, 8.0]
        ```
        """
        return self._def("transpose", fn)

    def def_batch(self, fn):
        """Defines batching (`sd.vmap`): `fn(args, dims, **params) -> (out, dim)`.

        `args` are the operands, `dims` the axis of each that runs over the
        batch, or None for an operand that is the same for every example.
        Return the batched output and its batch axis (a list of outputs and
        a list of axes with `multiple_results`), written with sciad ops.
        Without it, `sd.vmap` maps the primitive one example at a time, with
        a `BatchFallbackWarning`.

        ```python
        @cube_p.def_batch
        def _cube_batch(args, dims):
            (x,), (d,) = args, dims
            return cube_p(x), d  # elementwise: the batch axis stays where it is

        sd.vmap(lambda x: cube_p(x), in_axes=1)(np.ones((2, 5))).shape  # (5, 2)
        ```
        """
        return self._def("batch", fn)

    def def_sparsity(self, fn):
        """Defines the Jacobian-sparsity rule: `fn(out_types, *deps, **params)
        -> pattern`.

        `deps[i]` is operand `i` as a `sd.graph.Deps`: `.matrix`, a boolean
        SciPy CSR matrix with one row per element of the operand (C order; a
        sparse matrix's stored entries) and one column per element of the
        differentiated inputs, marking which of them it depends on; `.shape`;
        and `.value` where the operand is a constant (else None).
        `out_types` are the output types. Return the same kind of matrix for
        the output, one row per output element (a list with
        `multiple_results`). `sd.sparse.jacobian_sparsity`,
        `sd.sparse.jacobian` and Newton solves interpret graphs with it; a
        primitive without one counts as dense, with a `SparsityWarning`.

        ```python
        # element i of the cube depends on element i of x only
        cube_p.def_sparsity(lambda out_types, x: x.matrix)

        sd.sparse.jacobian_sparsity(lambda x: cube_p(x[::-1]), np.ones(3)).nnz  # 3
        ```
        """
        return self._def("sparsity", fn)

    def def_simplify(self, fn):
        """Defines a rewrite for the `simplify` pass: `fn(node, producer) ->
        Atom | Node | None`.

        The pass calls it on each node of this primitive with one output:
        `node` is the `sd.graph.Node` (`.inputs`: `Var`s and `Literal`s,
        `.params`), `producer(var)` the node that computes `var` (None for a
        graph input). Return a value of exactly the output's type to use in
        its place (a `Var` or a `Literal`), a node that computes the same
        output `Var`, or None to leave the node as it is. It must give
        exactly the same values (so `x * 0 -> 0` is wrong where `x` may be
        NaN).

        ```python
        flip_p = sd.primitive("doc_flip")
        flip_p.def_abstract_eval(lambda x: x)
        flip_p.def_impl(lambda x: x[::-1])

        @flip_p.def_simplify
        def _flip_simplify(node, producer):
            inner = producer(node.inputs[0])
            if inner is not None and inner.primitive is flip_p:
                return inner.inputs[0]  # flip(flip(x)) -> x
            return None

        g = sd.trace(lambda x: flip_p(flip_p(x)) * 2.0, np.ones(3))
        len(sd.graph.passes.simplify(g).nodes)  # 1
        ```
        """
        return self._def("simplify", fn)

    def def_vjp_fwd(self, fn):
        """Defines the forward half of a two-part reverse mode:
        `fn(primals, **params) -> (out, residuals)`.

        For a primitive whose backward pass needs values its forward pass
        computes (a loop's per-step states). Reverse mode emits it in place
        of the node: it returns the output (a tuple with
        `multiple_results`) and residuals, any Python object holding traced
        values, which `def_vjp_bwd`'s rule receives. Define both; they take
        precedence over `def_vjp`.

        ```python
        exp_p = sd.primitive("doc_exp")
        exp_p.def_abstract_eval(lambda x: x)
        exp_p.def_impl(jnp.exp)

        @exp_p.def_vjp_fwd
        def _exp_fwd(primals):
            y = exp_p(*primals)
            return y, y  # the output is also what the backward half needs

        @exp_p.def_vjp_bwd
        def _exp_bwd(y, ct):
            return (ct * y,)

        sd.grad(lambda x: exp_p(x))(0.0)  # 1.0
        ```
        """
        return self._def("vjp_fwd", fn)

    def def_vjp_bwd(self, fn):
        """Defines the backward half of a two-part reverse mode:
        `fn(residuals, ct, **params) -> in_cts`.

        `residuals` are what `def_vjp_fwd`'s rule returned, `ct` the
        output's cotangent (a tuple with `multiple_results`, a
        `sd.graph.Zero` for an output without one); return one cotangent per
        operand, None for an operand that takes none, as `def_vjp` does.
        Example: with `def_vjp_fwd`.

        ```python
        sd.grad(lambda x: exp_p(2.0 * x))(1.0)  # 14.7781121978613
        ```
        """
        return self._def("vjp_bwd", fn)

    def def_dce(self, fn):
        """Defines dead-output removal: `fn(node, used) -> Node | None`.

        For a primitive with several outputs (a loop's carries and stacked
        results): `used[i]` says whether output `i` is read. Return a node
        that computes only what is needed and keeps the used outputs' `Var`s
        (a subset of `node.outputs`, perhaps with fewer operands and a
        smaller body), or None to keep the node. The `dce` pass calls it,
        after cleaning the node's bodies.

        ```python
        powers_p = sd.primitive("doc_powers", multiple_results=True, params={"n": int})
        powers_p.def_abstract_eval(lambda x, *, n: [x] * n)
        powers_p.def_impl(lambda x, *, n: [x ** (k + 1) for k in range(n)])

        @powers_p.def_dce
        def _powers_dce(node, used):
            n = max((k + 1 for k, u in enumerate(used) if u), default=1)
            if n == node.params["n"]:
                return None
            return node.replace(params={"n": n}, outputs=node.outputs[:n])

        g = sd.trace(lambda x: powers_p(x, n=4)[1], np.ones(2))  # only x ** 2 is used
        sd.graph.passes.dce(g).nodes[0].params["n"]  # 2
        ```
        """
        return self._def("dce", fn)

    def def_hoist(self, fn):
        """Defines loop-invariant code motion: `fn(node) -> (nodes, node) |
        None`.

        For a loop: the nodes of its body that give the same values at every
        step (they read only the loop's consts), re-made to run before it,
        reading the node's operands, with fresh output `Var`s; and the loop
        node taking their results as new consts. Return None when nothing
        moves. The `hoist` pass calls it (for `scan`, see
        `sciad.graph._body.hoist_nodes`). The contract holds for any
        primitive; the example moves out a part of a node that has no body.

        ```python
        scaled_p = sd.primitive("doc_scaled")  # x * exp(a)
        scaled_p.def_abstract_eval(lambda x, a: x)
        scaled_p.def_impl(lambda x, a: x * jnp.exp(a))
        exp_op, mul_op = sd.graph.lookup_primitive("exp"), sd.graph.lookup_primitive("mul")

        @scaled_p.def_hoist
        def _scaled_hoist(node):
            x, a = node.inputs
            e = sd.graph.Var(a.type)
            return ([sd.graph.Node(exp_op, (a,), (e,))],
                    sd.graph.Node(mul_op, (x, e), node.outputs))

        g = sd.graph.passes.hoist(sd.trace(lambda x, a: scaled_p(x, a), np.ones(2), 0.5))
        [n.primitive.name for n in g.nodes]  # ['exp', 'mul']
        ```
        """
        return self._def("hoist", fn)

    def def_linearity(self, fn):
        """Defines the linearity rule: `fn(linear, **params) -> flags`.

        For a node that can read primal values and tangents at once (a loop
        of a tangent map carries both): `linear` flags the operands that are
        tangents; the rule returns, for each output, whether it depends on a
        flagged operand, so is a tangent itself. Transposing a tangent map
        asks it which outputs are which; the loops answer from their bodies
        (`sciad.graph._autodiff.graph_linear_outputs`). Without it, the
        node's `dce` rule answers, more coarsely.

        ```python
        pair_p = sd.primitive("doc_pair", multiple_results=True, params={})
        pair_p.def_abstract_eval(lambda x, t: [x, t])
        pair_p.def_impl(lambda x, t: [jnp.sin(x), jnp.cos(x) * t])

        @pair_p.def_linearity
        def _pair_linearity(linear):
            # sin(x) reads x alone; cos(x) t is linear in t
            return [linear[0], linear[1]]

        pair_p.linearity_rule([False, True])  # [False, True]
        ```
        """
        return self._def("linearity", fn)

    def def_cost(self, fn):
        """Defines the cost estimate: `fn(node, body) -> sd.graph.Cost`.

        `Cost(flops, temp, note)`: all of the node's floating-point work,
        the bytes it needs while it runs beyond its operands and results (a
        loop's body and stored carries, a factorization's fill), and a note
        for the report. `body(graph)` gives a body's own cost (`.flops`,
        `.peak`). `sd.cost` calls it; without it a node costs a FLOP per
        output element.

        ```python
        @outer_p.def_cost
        def _outer_cost(node, body):
            return sd.graph.Cost(flops=float(node.outputs[0].type.size), note="outer")

        sd.cost(lambda x, y: outer_p(x, y), np.ones(20), np.ones(30)).flops  # 600.0
        ```
        """
        return self._def("cost", fn)

    @property
    def rules(self) -> tuple[str, ...]:
        return tuple(r for r in _RULES if getattr(self, f"{r}_rule") is not None)

    # -- use -----------------------------------------------------------------
    def abstract_eval(self, *in_types, **params) -> tuple[AbstractType, ...]:
        """The output types, always as a tuple."""
        if self.abstract_eval_rule is None:
            raise MissingRuleError(
                "has no shape rule, so it cannot be traced. Define one with "
                f"`@{self.name}_p.def_abstract_eval`.", op=self.name)
        out = self.abstract_eval_rule(*in_types, **params)
        if self.multiple_results:
            out = tuple(out)
            bad = [t for t in out if not isinstance(t, AbstractType)]
        else:
            bad = [] if isinstance(out, AbstractType) else [out]
            out = (out,)
        if bad:
            raise TypeError(
                f"{self.name}: the shape rule must return "
                f"{'a sequence of types' if self.multiple_results else 'one type'} "
                f"(e.g. `sd.graph.TensorType(shape, dtype)`), got {bad[0]!r}.")
        return out

    @api_boundary
    def bind(self, *args, **params):
        from ._trace import bind  # (a cycle: _trace imports this module)

        return bind(self, args, params)

    __call__ = bind

    def param_problem(self, params: Mapping[str, Any], *, explicit: bool = False
                      ) -> str | None:
        """The first way `params` break this primitive's declaration, as text
        ("missing param `pattern` (expected Pattern)."), or None; always None
        for an undeclared primitive. `explicit=True` (a graph file) also
        requires the params that have defaults."""
        return param_problem(self.params, params, explicit=explicit)

    def __repr__(self) -> str:
        declared = ""
        if self.params is not None:
            declared = f", params=({', '.join(f'{k}: {p}' for k, p in self.params.items())})"
        return f"Primitive({self.name!r}{declared}, rules=[{', '.join(self.rules)}])"


class Holding(NamedTuple):
    """What a node's first output holds that the program running it made and
    must end (a primitive's `holds` trait gives it, from the node's params):

    - `release`: the primitive (declared `releases=True`) whose node ends it,
      `release(value, *after, **release_params)`, placed by `place_releases`
      after the last node reading the value (`after`: those readers'
      outputs, so the release waits for them); None where the readers end it
      themselves (SuperLU's host store counts its solves).
    - `release_now(first_array)`: ends it from the host, given the value's
      first array (a NumPy array), for a check that fails while the program
      runs (its raise stops the program before the release node). It must
      be idempotent: a second end of the same value does nothing.

    - `without`: the node's params with which it holds nothing (its readers
      then do without: a compiled solve factors in its own call), for a
      program XLA partitions over devices, where a release, a call with a
      side effect, has no place (`place_releases(graph, hold=False)`).

    A value that is an output of its graph is not released there: the node
    lowering that graph (a `map` handing its body's factorizations to the
    enclosing program) holds it in its turn, through its own `holds`.

    ```python
    f = next(n for n in g.nodes if n.primitive.name == "linalg.factor")
    f.primitive.holds(f.params)   # Holding(release=linalg.release, ...) for a KLU
                                  # factor whose readers are all in the program
    ```
    """

    release: "Primitive | None"
    release_params: Mapping[str, Any]
    release_now: Callable[[Any], None] | None
    without: Mapping[str, Any]


class Factored(NamedTuple):
    """How a node of a solve-like primitive computes from a shared
    factorization of its first operand (a primitive's `factored` trait
    gives it): `F = factor(operands[0], **factor_params)`, then
    `reader(F, *operands, **reader_params)` computes the node's outputs.
    Nodes whose factor and `factor_params` are equal, on the same matrix,
    share one `F`."""

    factor: Primitive
    factor_params: Mapping[str, Any]
    reader: Primitive
    reader_params: Mapping[str, Any]


def _definition_site() -> SourceInfo | None:
    """The frame that created a primitive: the first one outside this module."""
    import sys

    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    if frame is None:
        return None
    return SourceInfo(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


def _register(p: Primitive) -> None:
    old = _REGISTRY.get(p.name)
    if old is not None:
        raise RegistrationError(
            f"a primitive named {p.name!r} is already registered, at "
            f"{old.defined_at.long() if old.defined_at else '?'}; this second "
            f"definition is at {p.defined_at.long() if p.defined_at else '?'}. "
            "Choose another name.", op="primitive")
    _REGISTRY[p.name] = p


def primitive(name: str, *, multiple_results: bool = False,
              params: Mapping[str, Param | Any] | None = None) -> Primitive:
    """Creates and registers a new primitive.

    ```python
    p = sd.primitive("my_op", params={"scale": float})

    @p.def_abstract_eval
    def _shape(x, *, scale):
        return x

    @p.def_impl
    def _impl(x, *, scale):
        return jnp.sin(x) * scale
    ```

    **Arguments:**

    - `name`: the registered name, printed as the op and written to graph files.
    - `multiple_results`: whether the rules return a tuple of values.
    - `params`: the static params the rules take, `{name: Param or type}`
        (see `sciad.graph.Param`); `{}` for none. Declared params are checked
        by `verify` and by `Graph.from_json`. Without a declaration any
        params are accepted.

    **Returns:**

    The `Primitive`; define its rules with its `def_*` decorators.
    """
    return Primitive(name, multiple_results=multiple_results, params=params,
                     _source=user_source(2))


def lookup_primitive(name: str) -> Primitive | None:
    """The registered primitive named `name` (as a graph prints it), or None.

    ```python
    sd.graph.lookup_primitive("linalg.solve").rules   # ('impl', 'abstract_eval', 'jvp', ...)
    ```
    """
    return _REGISTRY.get(name)


def registered_primitives() -> dict[str, Primitive]:
    """All registered primitives, by name (a copy)."""
    return dict(_REGISTRY)
