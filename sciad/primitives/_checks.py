"""Run-time checks in lowered code: a predicate computed by XLA that, when
true, raises a sciad error naming the node being lowered and its source line.

The error leaves XLA as text (a host callback raises); `sd.function` and
`sd.graph.evaluate` turn that text back into the sciad exception (see
`sciad.errors.runtime_error_from`). A check costs one host callback per
call of the compiled program: nothing next to a factorization or a Krylov
solve, which is where it is used.
"""

from __future__ import annotations

import logging

import jax
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


for _name in ("jax._src.debugging", "jax._src.callback"):
    logging.getLogger(_name).addFilter(_DropSciadRuntimeErrors())


def raise_if(pred, cls: type, message: str, **values) -> None:
    """At run time, raises `cls(message.format(**values))` where `pred` holds.

    `values` are scalars computed by XLA (a residual, an iteration count)
    that the message and the error's attributes may use; under `vmap` the
    first failing element is reported.
    """
    node = current_node()
    op = node.primitive.name if node is not None else None
    source = node.source if node is not None else None
    where = ""
    if node is not None:
        from ..graph import format_node

        where = f"\n  while running: {format_node(node)}"

    def callback(pred, **vals):
        pred = np.asarray(pred)
        if not pred.any():
            return
        first = np.argmax(pred.ravel())
        scalars = {k: np.asarray(v).ravel()[first % max(np.asarray(v).size, 1)].item()
                   for k, v in vals.items()}
        raise RuntimeError(runtime_error_text(cls, message.format(**scalars) + where, op=op,
                                              source=source, **scalars))

    jax.debug.callback(callback, pred, **values)
