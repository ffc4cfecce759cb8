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
from ..errors import RegistrationError
from ._params import Param, as_declaration
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
        from ._print import format_node

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
    effects, or it can fail (`can_fail`)."""
    return has_effects(node) or can_fail(node)


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
        from ._print import format_graph

        return format_graph(self)

    def pretty(self, *, source: bool = True) -> str:
        """The SSA text; `source=False` leaves out the `# file:line` comments."""
        from ._print import format_graph

        return format_graph(self, source=source)

    def __repr__(self) -> str:
        return (f"<Graph {self.name}: {len(self.inputs)} inputs, {len(self.nodes)} nodes,"
                f" {len(self.outputs)} outputs>")

    def to_dot(self) -> str:
        from ._print import to_dot

        return to_dot(self)

    def to_json(self, *, indent: int | None = None, hash: bool = False) -> str:
        """The graph as JSON text; `hash=True` adds a sha256 content hash that
        `from_json` checks. See `sciad.graph.graph_to_json`."""
        from ._serialize import graph_to_json

        return graph_to_json(self, indent=indent, hash=hash)

    @classmethod
    @api_boundary
    def from_json(cls, text: str | bytes, *, max_nodes: int | None = None,
                  max_elements: int | None = None, max_depth: int | None = None,
                  max_bytes: int | None = None, require_hash: bool = False) -> "Graph":
        """Rebuilds and verifies a graph written by `to_json`, within limits on
        its size (None: the defaults). See `sciad.graph.graph_from_json`."""
        from ._serialize import graph_from_json

        limits = {k: v for k, v in (("max_nodes", max_nodes),
                                    ("max_elements", max_elements),
                                    ("max_depth", max_depth),
                                    ("max_bytes", max_bytes)) if v is not None}
        return graph_from_json(text, require_hash=require_hash, **limits)

    def verify(self) -> "Graph":
        from ._verify import verify

        verify(self)
        return self


# --------------------------------------------------------------------------
# Primitives and the registry


_REGISTRY: dict[str, "Primitive"] = {}

_RULES = ("impl", "abstract_eval", "jvp", "vjp", "vjp_fwd", "vjp_bwd", "transpose", "batch",
          "sparsity", "simplify", "dce", "hoist", "linearity")


class Primitive:
    """An operation of the IR, with every rule it has stored on it.

    - `def_abstract_eval(fn)`: `fn(*in_types, **params) -> out_type(s)`, the
      shape/dtype rule; it raises `ShapeError` / `DTypeError` on bad input.
    - `def_impl(fn)`: `fn(*jax_arrays, **params)`, the JAX implementation
      that lowering calls.
    - `def_jvp`, `def_vjp`, `def_transpose`, `def_batch`: derivative and
      batching rules, written with sciad ops.
    - `def_vjp_fwd(fn)` and `def_vjp_bwd(fn)`: reverse mode in two halves,
      for a primitive whose backward pass needs values its forward pass
      computes (a loop's per-step residuals): `fn(primals, **params) ->
      (outs, residuals)` is emitted in place of the node, and
      `fn(residuals, cts, **params) -> in_cts` in the backward pass. They
      take precedence over `def_vjp`.
    - `def_sparsity(fn)`: `fn(*deps, **params) -> pattern(s)`, the
      Jacobian-sparsity rule: given each operand's `sciad.graph.Deps`
      (which elements of the differentiated inputs each of its elements
      depends on, as a boolean SciPy CSR matrix, and a constant operand's
      value), the same for each output. `sd.sparse.jacobian_sparsity` and
      the Newton solves interpret graphs with it (see
      `sciad.graph._sparsity`); a primitive without one is taken as dense,
      with a warning.
    - `def_simplify(fn)`: `fn(node, producer) -> Atom | Node | None`, a
      rewrite that the `simplify` pass tries on each node of this primitive
      (see `sciad.graph.passes.simplify`).
    - `def_dce(fn)`: `fn(node, used_outputs) -> Node | None` for a node
      with a body: a node computing only the used outputs (the same output
      `Var`s) from only the operands they need, or None to keep the node.
      The `dce` pass calls it, so a loop's unused outputs and carries go.
    - `def_hoist(fn)`: `fn(node) -> (nodes, node) | None` for a loop: the
      nodes of its body that are the same at every step, re-made to run
      before it (with new output `Var`s), and the node reading their
      results as consts. The `hoist` pass calls it.
    - `def_linearity(fn)`: `fn(linear, **params) -> flags` for a node with
      a body: which of its outputs depend on its operands flagged `linear`,
      from its body's (`sciad.graph._autodiff.graph_linear_outputs`). A
      loop of a tangent map computes primal carries beside tangent ones;
      transposing the map asks this rule which are which (without it, the
      node's `dce` rule answers, more coarsely).
    - `def_cost(fn)`: `fn(node, body) -> Cost`, the estimated FLOPs of a
      node and the memory it needs while it runs beyond its operands and
      results (a loop's body and stored carries, a factorization's fill);
      `body(graph)` gives a body's own `GraphCost`. `sd.cost` calls it
      (without one, a node costs a FLOP per output element).

    `p(*args, **params)` (or `p.bind`) adds a node while tracing and runs the
    implementation eagerly otherwise.

    Traits, declared as keyword arguments when the primitive is made and
    read as plain attributes (a transform or pass asks a node's primitive,
    never its name):

    - `runtime_checks=True` declares that the implementation checks its
      values when the program runs (a solve finding its matrix singular):
      lowering then passes it `site=` (a `sciad.primitives.Site`: the node's
      op, source line and text, for its messages), and `sd.function` waits
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
    - `fit_to_readers(params, readers, complete) -> params`, for a primitive
      making a factorization that nodes share: the node's params, given the
      nodes that read its result (`complete`: all of them declare
      `reads_factor`, and the factorization is not a graph output).
      `share_factors` calls it on every factorization node (which
      structure to assume, whether to raise, when to free it).

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

    def def_impl(self, fn):
        return self._def("impl", fn)

    def def_abstract_eval(self, fn):
        return self._def("abstract_eval", fn)

    def def_jvp(self, fn):
        return self._def("jvp", fn)

    def def_vjp(self, fn):
        return self._def("vjp", fn)

    def def_transpose(self, fn):
        return self._def("transpose", fn)

    def def_batch(self, fn):
        return self._def("batch", fn)

    def def_sparsity(self, fn):
        return self._def("sparsity", fn)

    def def_simplify(self, fn):
        return self._def("simplify", fn)

    def def_vjp_fwd(self, fn):
        return self._def("vjp_fwd", fn)

    def def_vjp_bwd(self, fn):
        return self._def("vjp_bwd", fn)

    def def_dce(self, fn):
        return self._def("dce", fn)

    def def_hoist(self, fn):
        return self._def("hoist", fn)

    def def_linearity(self, fn):
        return self._def("linearity", fn)

    def def_cost(self, fn):
        return self._def("cost", fn)

    @property
    def rules(self) -> tuple[str, ...]:
        return tuple(r for r in _RULES if getattr(self, f"{r}_rule") is not None)

    # -- use -----------------------------------------------------------------
    def abstract_eval(self, *in_types, **params) -> tuple[AbstractType, ...]:
        """The output types, always as a tuple."""
        from ..errors import MissingRuleError

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
        from ._trace import bind

        return bind(self, args, params)

    __call__ = bind

    def param_problem(self, params: Mapping[str, Any], *, explicit: bool = False
                      ) -> str | None:
        """The first way `params` break this primitive's declaration, as text
        ("missing param `pattern` (expected Pattern)."), or None; always None
        for an undeclared primitive. `explicit=True` (a graph file) also
        requires the params that have defaults."""
        from ._params import param_problem

        return param_problem(self.params, params, explicit=explicit)

    def __repr__(self) -> str:
        declared = ""
        if self.params is not None:
            declared = f", params=({', '.join(f'{k}: {p}' for k, p in self.params.items())})"
        return f"Primitive({self.name!r}{declared}, rules=[{', '.join(self.rules)}])"


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
    return _REGISTRY.get(name)


def registered_primitives() -> dict[str, Primitive]:
    """All registered primitives, by name (a copy)."""
    return dict(_REGISTRY)
