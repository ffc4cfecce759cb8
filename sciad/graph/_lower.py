"""`lower(graph)`: a graph as a function of JAX arrays.

Each node calls its primitive's implementation (`def_impl`); the result is
traced by `jax.jit` into one XLA program. A failing implementation is
re-raised as `LoweringError` with the node's printed line and source, and an
implementation whose result disagrees with the node's type is an error too
(a user primitive's shape rule and implementation must agree).
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .. import errors as _errors
from .._traceback import api_boundary
from ..config import x64_scope
from ..errors import DTypeError, LoweringError, MissingRuleError, SciadError, ShapeError, reraise
from ._core import Graph, Node
from ._interpret import Interpreter, node_error
from ._print import format_node
from ._types import SparseArray, TensorType, holds_tuple, leaf_types, runtime_type


@dataclass(frozen=True)
class Site:
    """Where a run-time check runs: the op, the user's source line and the
    node's printed form. Lowering passes one (`site=`) to the implementation
    of a primitive declared with `runtime_checks=True`; its `fail` and
    `warn`, called on the host while the program runs, name them."""

    op: str | None = None
    source: object = None
    text: str | None = None
    #: `(index, batch shape)` where the check judges one example of a batch
    #: (`in_example`): the failure names it
    example: tuple | None = None

    @classmethod
    def of(cls, node) -> "Site":
        return cls(node.primitive.name, node.source, format_node(node))

    def in_example(self, i: int, batch: tuple) -> "Site":
        """This site judging example `i` (flat) of a batch of shape `batch`
        (`sd.vmap`'s, or JAX's): its failures say which. An unbatched
        check (`batch == ()`) is this site."""
        if not batch:
            return self
        return dataclasses.replace(self, example=(np.unravel_index(i, batch), batch))

    def _where(self) -> str:
        if self.example is None:
            return ""
        index, batch = self.example
        at = ", ".join(str(int(j)) for j in index)
        shape = " x ".join(str(int(b)) for b in batch)
        return f" (in example [{at}] of a batch of {shape})"

    def fail(self, cls: type, message: str, **extra):
        """Raises `cls(message)` for this site, as the text that crosses XLA."""
        message = message + self._where()
        if self.text:
            message = f"{message}\n  while running: {self.text}"
        raise RuntimeError(_errors.runtime_error_text(cls, message, op=self.op,
                                                      source=self.source, **extra))

    def warn(self, category: type, message: str) -> None:
        """Warns with `category`, attributed to the user's line (shown once
        per line and text: Python's default filter, with a registry per file)."""
        message = message + self._where()
        text = f"{self.op}: {message}" if self.op else message
        src = self.source
        filename = getattr(src, "file", None) or "<sciad>"
        lineno = getattr(src, "line", None) or 0
        registry = _registries.setdefault(filename, {})
        warnings.warn_explicit(text, category, filename, lineno, module=filename,
                               registry=registry)


_registries: dict[str, dict] = {}


class _Scope:
    """One lowering run: the graph, the node being lowered, and the
    finalizers registered for the end of the run (`at_end`)."""

    __slots__ = ("graph", "node", "finalizers", "outputs", "offer", "handed", "takes", "made")

    def __init__(self, graph: Graph):
        self.graph = graph
        self.node: Node | None = None
        self.finalizers: list = []
        # (`made_in_run` / `in_flight`: what the run made and frees at its end,
        # with a host release for a failed run)
        self.made: list = []
        self.outputs: set | None = None
        # (`offer_body_outputs` / `hand_out`: a body's outputs whose release
        # the node lowering it takes over, and what the body handed it)
        self.offer: frozenset | None = None
        self.handed: list = []
        self.takes: frozenset | None = None


_scopes = threading.local()


def _stack() -> list:
    stack = getattr(_scopes, "stack", None)
    if stack is None:
        stack = _scopes.stack = []
    return stack


def at_end(fn: Callable[[list], None]) -> None:
    """Registers `fn(outputs)` to run when the lowering of the current graph
    has lowered all its nodes (`outputs`: the JAX values the run returns).
    A node's implementation releases there what it made for the program
    (a compiled factorization's handles: `sciad.primitives._linalg_run`),
    ordered after every value the run returns. A nested body (a loop's, a
    branch's, a map's) is lowered by its own run, with its own finalizers.
    Outside a lowering run, `fn` is never called (nothing is made to last)."""
    stack = _stack()
    if stack:
        stack[-1].finalizers.append(fn)


def made_in_run(value, release_now: Callable[[Any], None]) -> None:
    """Registers `value` (a factorization's handles) as made by the current
    run and freed at its end, with `release_now(host_value)`, which frees it
    from the host: a host check that fails while the run is in flight calls
    it before it raises (the raise stops the program, so the release at the
    end may never run; see `in_flight`). `release_now` must be idempotent
    (`release_now.idempotent`): a release of handles released already, by
    the program or by another check that failed at the same time, frees
    nothing (KLU's and cuDSS's handles carry a generation; SuperLU's store
    forgets a handle once)."""
    assert getattr(release_now, "idempotent", False), (
        "made_in_run: a host release must be idempotent; this is a bug in sciad")
    stack = _stack()
    if stack:
        stack[-1].made.append((value, release_now))


def in_flight() -> list:
    """`(value, release_now)` of what the current run, and the runs lowering
    it (a loop's or a map's body: a check's raise stops the whole program),
    made so far and free at their ends (`made_in_run`): a host check passes
    the values to the host and releases them there if it raises."""
    return [m for scope in _stack() for m in scope.made]


def node_escapes() -> bool:
    """Whether an output of the node being lowered is an output of the graph
    being lowered (it then outlives this run: a nested body's result, or the
    program's). True outside a lowering run."""
    stack = _stack()
    if not stack or stack[-1].node is None:
        return True
    scope = stack[-1]
    if scope.outputs is None:
        scope.outputs = {id(a) for a in scope.graph.outputs}
    return any(id(v) in scope.outputs for v in scope.node.outputs)


def offer_body_outputs() -> None:
    """Called by a node's implementation (a `map`'s) before it lowers its
    body, whose outputs are the node's outputs one for one: the body may
    hand it the release of those outputs the graph being lowered does not
    return (`hand_out`), for `take_handed` to register at this run's end."""
    stack = _stack()
    if not stack or stack[-1].node is None:
        return
    scope = stack[-1]
    if scope.outputs is None:
        scope.outputs = {id(a) for a in scope.graph.outputs}
    scope.offer = frozenset(k for k, v in enumerate(scope.node.outputs)
                            if id(v) not in scope.outputs)


def hand_out(release: Callable[[Any, list], None],
             release_now: Callable[[Any], None] | None = None) -> bool:
    """For a node whose outputs escape its graph only as outputs of a body
    whose caller offered to take them (`offer_body_outputs`): hands the
    caller `release(value, outputs)`, to be run at the end of the caller's
    run on the caller's value of that output (and `release_now`, registered
    there with `made_in_run`). Returns whether it was taken (else the node's
    outputs outlive every run it can see)."""
    stack = _stack()
    if len(stack) < 2 or stack[-1].node is None or stack[-1].takes is None:
        return False
    scope = stack[-1]
    outs = [k for k, a in enumerate(scope.graph.outputs)
            if any(a is v for v in scope.node.outputs)]
    if not outs or not all(k in scope.takes for k in outs):
        return False
    stack[-2].handed.append((outs[0], release, release_now))
    return True


def take_handed(outputs: Sequence[Any] | None) -> None:
    """Registers at this run's end the releases a body handed out while the
    caller lowered it (`hand_out`), each on the caller's value of that body
    output (None: the lowering failed; nothing to release); ends the offer."""
    stack = _stack()
    if not stack:
        return
    scope = stack[-1]
    handed, scope.handed, scope.offer = scope.handed, [], None
    if outputs is None:
        return
    for k, release, release_now in handed:
        value = outputs[k]
        at_end(lambda outs, release=release, value=value: release(value, outs))
        if release_now is not None:
            made_in_run(value, release_now)


#: the size (elements) from which a constant is kept from XLA's constant
#: folding (`LowerInterpreter.literal`)
LARGE_LITERAL = 4096


class LowerInterpreter(Interpreter):
    def run(self, *args) -> list:
        scope = _Scope(self.graph)
        stack = _stack()
        if stack and stack[-1].offer is not None:  # (a map's body, lowered again after
            scope.takes = stack[-1].offer          # a failed vmap: what it handed is
            stack[-1].handed = []                  # dropped)
        stack.append(scope)
        try:
            outs = super().run(*args)
            # (the releases wait for the outputs; a failed check's host
            # function has released what the runs made, and a release of
            # handles released already frees nothing: `made_in_run`)
            after = list(outs)
            for fn in scope.finalizers:
                fn(after)
        finally:
            stack.pop()
        return outs

    def literal(self, lit):
        # implementations receive JAX arrays only (`x.at[...]` and friends).
        # A large constant goes through an optimization barrier: XLA does not
        # fold what reads it at compile time (a sparse matrix's captured
        # values scattered onto its pattern: 1.6 s to compile at 128^2
        # unknowns, against 0.5 s with the values an argument; 0.24 s so)
        v = jnp.asarray(lit.value)
        if v.size >= LARGE_LITERAL:
            v = jax.lax.optimization_barrier(v)
        return v

    def run_node(self, node: Node, invals: Sequence[Any]) -> Sequence[Any]:
        prim = node.primitive
        impl = prim.impl_rule
        if impl is None:
            raise MissingRuleError(
                f"has no implementation, so it cannot be lowered. Define one with "
                f"`@{prim.name}_p.def_impl`.", op=prim.name, source=node.source)
        scope = _stack()[-1] if _stack() else None
        if scope is not None:
            scope.node = node
        try:
            if prim.runtime_checks:
                out = impl(*invals, site=Site.of(node), **node.params)
            else:
                out = impl(*invals, **node.params)
        except SciadError as e:
            raise e.with_source(node.source)
        except Exception as e:
            raise node_error(LoweringError, node, e, "the JAX implementation") from e
        outs = tuple(out) if prim.multiple_results else (out,)
        if len(outs) != len(node.outputs):
            raise LoweringError(
                f"the implementation returned {len(outs)} values, the node has "
                f"{len(node.outputs)} outputs.", op=prim.name, source=node.source)
        for v, o in zip(node.outputs, outs):
            t = runtime_type(v.type)
            if t is not None and (
                    tuple(np.shape(o)) != t.shape or np.dtype(o.dtype) != t.dtype):
                got = TensorType(np.shape(o), o.dtype).str_short()
                raise LoweringError(
                    f"the implementation returned {got} where the shape rule says "
                    f"{t.str_short()}"
                    + ("" if t is v.type else f" (the data of {v.type.str_short()})")
                    + "; the two rules must agree.", op=prim.name,
                    source=node.source)
        return outs


def lower(graph: Graph) -> Callable[..., list]:
    """A function `f(*flat_inputs) -> list of outputs` on JAX arrays.

    Call it inside `jax.jit` (as `sd.function` does) for one compiled XLA
    program; called directly it runs op by op.
    """
    def lowered(*args):
        return LowerInterpreter(graph).run(*args)

    lowered.__name__ = graph.name
    return lowered


@api_boundary
def evaluate(graph: Graph, *args) -> list:
    """Compiles and runs `graph` on concrete inputs; returns a list of arrays.

    Each argument must have its input's type (the run-time arrays of it: a
    sparse matrix's data vector, a `SparseArray`, or a factorization's
    tuple); a wrong shape or dtype is a `ShapeError` / `DTypeError` naming
    the input, not a program compiled for other types. An error found by a
    run-time check (a singular matrix, a solver that did not converge) is
    raised as the sciad error it names."""
    args = _checked_args(graph, args)
    with x64_scope():
        try:
            return jax.block_until_ready(jax.jit(lower(graph))(*args))
        except Exception as e:  # JaxRuntimeError, or ValueError from a callback
            reraise(e)


def _checked_args(graph: Graph, args) -> list:
    if len(args) != len(graph.inputs):
        raise TypeError(f"evaluate: graph {graph.name!r} takes {len(graph.inputs)} inputs, "
                        f"got {len(args)}.")
    out = []
    for k, (v, a) in enumerate(zip(graph.inputs, args)):
        if isinstance(a, SparseArray):
            if a.type.pattern != getattr(v.type, "pattern", None):
                raise ShapeError(f"input {k} is {v.type.str_short()}, got a sparse matrix "
                                 f"{a.type.str_short()}.", op="evaluate")
            a = a.data
        want = leaf_types(v.type)
        if want is None:
            out.append(a)
            continue
        if isinstance(a, (bool, int, float, complex)) and len(want) == 1:
            a = np.asarray(a, want[0].dtype)  # a Python scalar takes the input's dtype
        got = tuple(a) if holds_tuple(v.type) and isinstance(a, tuple) else (a,)
        if len(got) != len(want):
            raise ShapeError(f"input {k} is {v.type.str_short()} ({len(want)} arrays), got "
                             f"{len(got)}.", op="evaluate")
        for g, w in zip(got, want):
            shape, dtype = tuple(np.shape(g)), np.dtype(getattr(g, "dtype", np.asarray(g).dtype))
            if shape != w.shape:
                raise ShapeError(f"input {k} ({v.hint or 'unnamed'}) is {v.type.str_short()}, "
                                 f"got an array of shape {shape}.", op="evaluate")
            if dtype != w.dtype:
                raise DTypeError(f"input {k} ({v.hint or 'unnamed'}) is {v.type.str_short()}, "
                                 f"got dtype {dtype}; convert it first "
                                 f"(`.astype(np.{w.dtype.name})`).", op="evaluate")
        out.append(a if len(got) == 1 and not holds_tuple(v.type) else tuple(got))
    return out
