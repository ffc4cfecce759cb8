"""Run-time checks in lowered code: a predicate computed by XLA that, when
true, raises a sciad error naming the node being lowered and its source line.

The error leaves XLA as text (a host callback raises); `sd.function` and
`sd.graph.evaluate` turn that text back into the sciad exception (see
`sciad.errors.runtime_error_from`). A check costs one host callback (a
device-to-host copy of a flag on a GPU) per call of the compiled program:
nothing next to a factorization or a Krylov solve, which is where it is
used.
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import RUNTIME_MARKER, runtime_error_text
from ..graph._lower import current_node


class _DropSciadRuntimeErrors(logging.Filter):
    """JAX logs a failing callback's traceback before re-raising it; a sciad
    run-time check failing is an ordinary error the user gets as an
    exception, so its log record is dropped (other callbacks' are kept)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (exc is not None and RUNTIME_MARKER in str(exc))


logging.getLogger("jax._src.callback").addFilter(_DropSciadRuntimeErrors())


def raise_if(pred, cls: type, message: str, **values):
    """At run time, raises `cls(message.format(**values))` where `pred` holds.

    Returns a token (an int32 zero) that the caller must `tie` into the value
    it returns: the check is a host callback whose result that value then
    depends on, so XLA can neither drop it nor run the rest without it, and
    its error surfaces from the call that computed the value (on a GPU as on
    the CPU). `values` are scalars computed by XLA (a residual, an iteration
    count) that the message and the error's attributes may use; under `vmap`
    the first failing element is reported.
    """
    node = current_node()
    op = node.primitive.name if node is not None else None
    source = node.source if node is not None else None
    where = ""
    if node is not None:
        from ..graph import format_node

        where = f"\n  while running: {format_node(node)}"
    names = list(values)

    def host(pred, *vals):
        pred = np.asarray(pred)
        vals = [np.asarray(v) for v in vals]
        batch = np.broadcast_shapes(pred.shape, *(v.shape for v in vals))
        if pred.any():
            first = int(np.argmax(np.broadcast_to(pred, batch).ravel()))
            scalars = {k: np.broadcast_to(v, batch).ravel()[first].item()
                       for k, v in zip(names, vals)}
            raise RuntimeError(runtime_error_text(
                cls, message.format(**scalars) + where, op=op, source=source, **scalars))
        return np.zeros(batch, np.int32)

    # Only bool and 32-bit values cross: the callback's thread may not have
    # sciad's x64 scope (see sciad.solvers._host).
    vals = [jnp.asarray(values[k]).astype(jnp.float32) if jnp.issubdtype(
        jnp.asarray(values[k]).dtype, jnp.floating) else jnp.asarray(values[k]).astype(jnp.int32)
        for k in names]
    return jax.pure_callback(host, jax.ShapeDtypeStruct((), jnp.int32), pred, *vals,
                             vmap_method="expand_dims")


def tie(value, *tokens):
    """`value` made to depend on check tokens (it is unchanged: they are 0)."""
    if not tokens:
        return value
    total = tokens[0]
    for t in tokens[1:]:
        total = total + t
    leaves, treedef = jax.tree_util.tree_flatten(value)
    for i, leaf in enumerate(leaves):
        dt = jnp.asarray(leaf).dtype
        if jnp.issubdtype(dt, jnp.number):
            leaves[i] = leaf + total.astype(dt)
            return jax.tree_util.tree_unflatten(treedef, leaves)
    raise AssertionError("tie: no numeric leaf to carry the check; this is a bug in sciad")
