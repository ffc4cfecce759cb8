"""`lower(graph)`: a graph as a function of JAX arrays.

Each node calls its primitive's implementation (`def_impl`); the result is
traced by `jax.jit` into one XLA program. A failing implementation is
re-raised as `LoweringError` with the node's printed line and source, and an
implementation whose result disagrees with the node's type is an error too
(a user primitive's shape rule and implementation must agree).

Lowering is a plain interpreter: where what a program makes ends is in the
graph (`place_releases` puts a release node after the last reader of every
value a node `holds`). What it keeps is the list of such values made so far
in this run and the runs lowering it (`Site.held`), which it hands to every
check with the node's site: a check that fails stops the program before its
release nodes run, so it ends them from the host first.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .. import errors as _errors
from .._traceback import api_boundary
from ..config import x64_scope
from ..errors import DTypeError, LoweringError, MissingRuleError, SciadError, ShapeError, reraise
from . import _passes
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
    #: `((value, release_now), ...)`: what the program made and holds when
    #: this node runs (a node's `holds`: the first array of its value, and
    #: the host release of a failed check), in this run and the runs lowering
    #: it. JAX values of the program: a check passes them to its host call
    #: (`sciad.primitives._checks.releasing`) and keeps the `bare` site
    held: tuple = field(default=(), compare=False, repr=False)

    @classmethod
    def of(cls, node, held: tuple = ()) -> "Site":
        return cls(node.primitive.name, node.source, format_node(node), held=tuple(held))

    @property
    def bare(self) -> "Site":
        """This site without `held` (what a host function keeps)."""
        return dataclasses.replace(self, held=()) if self.held else self

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


#: the size (elements) from which a constant is kept from XLA's constant
#: folding (`LowerInterpreter.literal`)
LARGE_LITERAL = 4096


@functools.lru_cache(maxsize=None)
def _takes_site(impl: Callable) -> bool:
    """Whether an implementation declares a `site` parameter (a node with a
    body forwards `site.held` to the lowering of its body)."""
    try:
        return "site" in inspect.signature(impl).parameters
    except (TypeError, ValueError):
        return False


def _first_array(value):
    return jax.tree_util.tree_leaves(value)[0]


class LowerInterpreter(Interpreter):
    """Lowers `graph` node by node. `held`: what the runs lowering this one
    (a loop's, a map's) made and hold (`Site.held`)."""

    def __init__(self, graph: Graph, held: tuple = ()):
        super().__init__(graph)
        self.outer = tuple(held)
        self.held: list = []
        self.large: dict = {}  # equal large constants -> their one JAX value

    def run(self, *args) -> list:
        self.held = list(self.outer)
        return super().run(*args)

    def literal(self, lit):
        # implementations receive JAX arrays only (`x.at[...]` and friends).
        # A large constant goes through an optimization barrier: XLA does not
        # fold what reads it at compile time (a sparse matrix's captured
        # values scattered onto its pattern: 1.6 s to compile at 128^2
        # unknowns, against 0.5 s with the values an argument; 0.24 s so).
        # Equal large constants (one constant read by several nodes, or two
        # equal ones) become one JAX value: one buffer the executable reads
        # (sciad has JAX hoist large constants: `sciad.config`), and one the
        # compiler sees is shared (a solve and its adjoint of one
        # right-hand side)
        if np.size(lit.value) < LARGE_LITERAL:
            return jnp.asarray(lit.value)
        key = _passes.literal_key(lit)
        v = self.large.get(key)
        if v is None:
            v = self.large[key] = jax.lax.optimization_barrier(jnp.asarray(lit.value))
        return v

    def run_node(self, node: Node, invals: Sequence[Any]) -> Sequence[Any]:
        prim = node.primitive
        impl = prim.impl_rule
        if impl is None:
            raise MissingRuleError(
                f"has no implementation, so it cannot be lowered. Define one with "
                f"`@{prim.name}_p.def_impl`.", op=prim.name, source=node.source)
        try:
            if prim.runtime_checks or _takes_site(impl):
                out = impl(*invals, site=Site.of(node, self.held), **node.params)
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
        held = prim.holds(node.params) if prim.holds is not None else None
        if held is not None and held.release_now is not None and outs:
            assert getattr(held.release_now, "idempotent", False), (
                f"{prim.name}: a host release must be idempotent; this is a bug in sciad")
            self.held.append((_first_array(outs[0]), held.release_now))
        return outs


def lower(graph: Graph, held: tuple = ()) -> Callable[..., list]:
    """A function `f(*flat_inputs) -> list of outputs` on JAX arrays.

    Call it inside `jax.jit` (as `sd.function` does) for one compiled XLA
    program; called directly it runs op by op. `held`: for a body lowered by
    a node's implementation (a loop's, a map's), what the enclosing runs
    hold (the node's `site.held`), so a check in the body that fails ends
    it too.
    """
    def lowered(*args):
        return LowerInterpreter(graph, held).run(*args)

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
