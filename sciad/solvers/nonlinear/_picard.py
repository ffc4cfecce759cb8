"""`"picard"` (a name `sd.optimize.fixed_point` takes): the plain fixed-point
iteration, the node's `method="anderson"` with `memory=0`."""

from __future__ import annotations

from ._anderson import Anderson


class Picard(Anderson):
    """Picard iteration (an alias: the node holds "anderson", memory 0)."""

    name = "picard"
    node_method = "anderson"
    memory = 0
