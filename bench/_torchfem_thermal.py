"""Mosaic's thermal_mesh task in torch-fem (the peer `bench/mosaic.py` runs on
this machine): the same mesh, SIMP law, flux and compliance as
`mosaic.Thermal`, written with torch-fem's public API as Mosaic's torch-fem
solver writes it (`SolidHeat`, an `IsotropicConductivity3D` material
vectorized over the cells and scaled per cell by the SIMP factor), the
gradient by torch's autograd through torch-fem's implicit adjoint
(`differentiable_parameters`).

Install: `pip install torch --index-url https://download.pytorch.org/whl/cpu` then
`pip install torch-fem` (both outside the `bench` extra: torch is large);
`bench/mosaic.py` runs it where it is installed.

`method`: torch-fem's linear solver, `None` for its default (a direct
solve below 10,000 unknowns, conjugate gradients with algebraic multigrid
above, to its default tolerance), or `"direct"` (SciPy's `spsolve` without
pypardiso). torch's float64, on the CPU.
"""

from __future__ import annotations

import numpy as np


def _torch():
    import torch

    torch.set_default_dtype(torch.float64)
    return torch


class TorchFemThermal:
    """One mesh of `mosaic.Thermal(nx)` in torch-fem."""

    def __init__(self, task, method: str | None = None):
        torch = _torch()
        from torchfem import SolidHeat
        from torchfem.materials import IsotropicConductivity3D

        self.task, self.method = task, method
        points = task.points
        cells = _cells(task).astype(np.int64)
        self.nodes = torch.as_tensor(points, dtype=torch.float64)
        self.elements = torch.as_tensor(cells, dtype=torch.long)
        self.material = IsotropicConductivity3D(kappa=1.0)
        self.model = SolidHeat(self.nodes, self.elements, self.material)
        n = points.shape[0]
        flux = np.zeros((n, 1))
        flux[task.free, 0] = task.f
        self.flux = torch.as_tensor(flux)
        fixed = np.ones(n, bool)
        fixed[task.free] = False
        self.fixed = torch.as_tensor(fixed[:, None])
        self.SolidHeat = SolidHeat

    def value_and_grad(self, rho, grad: bool = True):
        """`(C, dC/drho)` (`dC/drho` None without `grad`)."""
        torch = _torch()
        from mosaic import K_MAX, K_MIN, P

        r = torch.as_tensor(np.asarray(rho, np.float64)).requires_grad_(grad)
        model = self.model
        model.material = self.material.vectorize(model.n_elem)
        scale = K_MIN / K_MAX + (1.0 - K_MIN / K_MAX) * torch.clamp(r, 0.0, 1.0) ** P
        model.material.KAPPA = (K_MAX * scale)[:, None, None] * model.material.KAPPA
        model.constraints = self.fixed
        model.heat_flux = self.flux
        with torch.set_grad_enabled(grad):
            T, *_ = model.solve(method=self.method,
                                differentiable_parameters=r if grad else None)
            C = torch.sum(self.flux.ravel() * T.ravel())
        if not grad:
            return float(C), None
        (g,) = torch.autograd.grad(C, r)
        return float(C.detach()), g.numpy()


def _cells(task) -> np.ndarray:
    """The cells of `task`'s mesh (Mosaic's numbering, VTK's node order)."""
    from mosaic import LX, LY, mesh

    _, cells = mesh(task.nx, task.ny, 1, LX, LY, task.dz)
    return cells
