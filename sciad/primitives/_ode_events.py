"""The guard of a terminal event (`sd.ode.odeint_event`): no event time where
none was found. One node, `ode.event_guard`, that passes an event's time
through after checking at run time that the event function crossed zero."""

from __future__ import annotations

import numpy as np

from ..errors import ConvergenceError, DTypeError
from ..graph import Primitive, Site, TensorType, Zero, is_zero
from ..graph._autodiff import type_of
from ..graph._batch import batch_size_of, batched_front
from ._checks import check, tie

event_guard_p = Primitive("ode.event_guard", runtime_checks=True,
                          params={"direction": int})
#: `event_guard(found, span, t)`: `t` (an event's time), after checking
#: that the event function crossed zero (`found`, a bool) on the span
#: `(span[0], span[1]]` (`direction`: +1 upwards, -1 downwards, 0 either);
#: linear in `t` (its transpose is itself)


@event_guard_p.def_abstract_eval
def _event_guard_shape(found, span, t, *, direction):
    if not isinstance(found, TensorType) or found.dtype != np.bool_ \
            or not isinstance(span, TensorType) or span.shape[-1:] != (2,):
        raise DTypeError(f"needs a bool and a span of 2 times, got {found} and {span}.",
                         op="ode.event_guard")
    return t


def judge_event(site, *, found, span, direction):
    found = np.asarray(found).reshape(-1)  # (a batch: its first failing example)
    if found.all():
        return
    t0, t1 = np.asarray(span, np.float64).reshape(-1, 2)[
        int(np.argmin(found)) if np.ndim(span) > 1 else 0]
    way = {1: "upwards ", -1: "downwards ", 0: ""}[direction]
    site.fail(ConvergenceError,
              f"no event: the event function did not cross zero {way}on ({t0:.6g}, "
              f"{t1:.6g}] along the solution. Integrate over a longer span, or check the "
              f"event function's sign at the start and the `direction`.")


@event_guard_p.def_impl
def _event_guard_impl(found, span, t, *, direction, site=None):
    return tie(t, check(judge_event, site or Site("ode.event_guard"), when=~found.all(),
                        found=found, span=span, direction=direction))


@event_guard_p.def_jvp
def _event_guard_jvp(primals, tangents, **params):
    (found, span, t), (_, _, dt) = primals, tangents
    out = event_guard_p.bind(found, span, t, **params)
    return out, Zero(type_of(out).update()) if is_zero(dt) else \
        event_guard_p.bind(found, span, dt, **params)


@event_guard_p.def_transpose
def _event_guard_transpose(ct, found, span, t, **params):
    return None, None, event_guard_p.bind(found, span, ct, **params)


@event_guard_p.def_batch
def _event_guard_batch(args, dims, **params):
    size = batch_size_of(args, dims)
    found, span, t = (batched_front(a, d, size) for a, d in zip(args, dims))
    return event_guard_p.bind(found, span, t, **params), 0


@event_guard_p.def_sparsity
def _event_guard_sparsity(outs, found, span, t, **params):
    return t.matrix
