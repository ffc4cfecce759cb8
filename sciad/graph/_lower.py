"""`lower(graph)`: a graph as a function of JAX arrays.

Each node calls its primitive's implementation (`def_impl`); the result is
traced by `jax.jit` into one XLA program. A failing implementation is
re-raised as `LoweringError` with the node's printed line and source, and an
implementation whose result disagrees with the node's type is an error too
(a user primitive's shape rule and implementation must agree).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import LoweringError, MissingRuleError, SciadError
from ._core import Graph, Node
from ._interpret import Interpreter, node_error
from ._types import TensorType, runtime_type


_state = threading.local()


def current_node() -> Node | None:
    """The node being lowered (for implementations whose run-time checks
    name it), or None outside lowering."""
    return getattr(_state, "node", None)


class LowerInterpreter(Interpreter):
    def literal(self, lit):
        # implementations receive JAX arrays only (`x.at[...]` and friends)
        return jnp.asarray(lit.value)

    def run_node(self, node: Node, invals: Sequence[Any]) -> Sequence[Any]:
        prim = node.primitive
        impl = prim.impl_rule
        if impl is None:
            raise MissingRuleError(
                f"has no implementation, so it cannot be lowered. Define one with "
                f"`@{prim.name}_p.def_impl`.", op=prim.name, source=node.source)
        prev, _state.node = getattr(_state, "node", None), node
        try:
            out = impl(*invals, **node.params)
        except SciadError as e:
            raise e.with_source(node.source)
        except Exception as e:
            raise node_error(LoweringError, node, e, "the JAX implementation") from e
        finally:
            _state.node = prev
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
    interp = LowerInterpreter(graph)

    def lowered(*args):
        return interp.run(*args)

    lowered.__name__ = graph.name
    return lowered


def evaluate(graph: Graph, *args) -> list:
    """Compiles and runs `graph` on concrete inputs; returns a list of arrays.
    An error found by a run-time check (a singular matrix, a solver that did
    not converge) is raised as the sciad error it names."""
    from ..config import x64_scope
    from ..errors import runtime_error_from

    with x64_scope():
        try:
            return jax.block_until_ready(jax.jit(lower(graph))(*args))
        except Exception as e:  # JaxRuntimeError, or ValueError from a callback
            err = runtime_error_from(e)
            if err is None:
                raise
            raise err from None
