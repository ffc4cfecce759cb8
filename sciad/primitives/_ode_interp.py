"""The forward solution of an `ode.odeint` node between its steps: the cubic
Hermite interpolant of the states at the step times and the vector field
there (the interpolated adjoint's state on the way back, the replay's first
Newton iterate, an event's location)."""

from __future__ import annotations

from .. import _ops as ops
from ..graph import Graph
from ._ode_field import field_at


def hermite_at(s: float, h, y0, y1, f0, f1):
    """The cubic Hermite interpolant of `(y0, f0)` and `(y1, f1)` a step `h`
    apart, at the fraction `s` of the step."""
    s2, s3 = s * s, s * s * s
    return ((2 * s3 - 3 * s2 + 1) * y0 + (s3 - 2 * s2 + s) * h * f0
            + (3 * s2 - 2 * s3) * y1 + (s3 - s2) * h * f1)


def hermite(dense, grid, nsteps, graph: Graph, consts, t):
    """The forward solution at `t` from its states at the step times: the
    cubic Hermite interpolant on the step containing `t` (its slopes are the
    vector field at the step's ends)."""

    k = ops.clip(ops.searchsorted(grid, t, side="right") - 1, 0, nsteps - 1)
    t0, t1 = grid[k], grid[k + 1]
    y0, y1 = dense[k], dense[k + 1]
    h = t1 - t0
    f0, f1 = field_at(graph, consts, t0, y0), field_at(graph, consts, t1, y1)
    return hermite_at((t - t0) / h, h, y0, y1, f0, f1)
