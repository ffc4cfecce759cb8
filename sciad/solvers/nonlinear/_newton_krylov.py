"""`"newton_krylov"` (a name `sd.optimize.root` takes): Newton's method with
matrix-free GMRES steps, the node's `method="newton"` with `jac="gmres"`."""

from __future__ import annotations

from ._newton import Newton


class NewtonKrylov(Newton):
    """Newton with a matrix-free Jacobian (an alias: the node holds "newton")."""

    name = "newton_krylov"
    node_method = "newton"
    jac = "gmres"
