"""Mosaic's mesh tasks in torch-fem (the peer `bench/mosaic.py` runs on this
machine): the same meshes, SIMP laws, loads and compliances as
`mosaic.Thermal` and `mosaic.Structural`, written with torch-fem's public
API as Mosaic's torch-fem solver writes the thermal one (`SolidHeat`, an
`IsotropicConductivity3D` material vectorized over the cells and scaled per
cell by the SIMP factor; the structural task likewise with `Solid` and
`IsotropicElasticity3D`, its stiffness tensor scaled per cell), the
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


class _TorchFem:
    """One mesh of a Mosaic task in torch-fem: the model, the load on every
    node (zero where fixed) and the constraints, made once; a call scales the
    material per cell and solves. A task sets `_model(nodes, elements)`,
    `_scale(material, factor)` (the cell-wise material times the SIMP
    factor) and `_load(model, load)`."""

    components = 1

    def __init__(self, task, method: str | None = None):
        torch = _torch()
        self.task, self.method = task, method
        c = self.components
        self.nodes = torch.as_tensor(task.points, dtype=torch.float64)
        self.elements = torch.as_tensor(self._cells(task).astype(np.int64), dtype=torch.long)
        self.model, self.material = self._model(self.nodes, self.elements)
        n = task.points.shape[0]
        load = np.zeros(n * c)
        load[task.free] = task.f
        self.load = torch.as_tensor(load.reshape(n, c))
        fixed = np.ones(n * c, bool)
        fixed[task.free] = False
        self.fixed = torch.as_tensor(fixed.reshape(n, c))

    def value_and_grad(self, rho, grad: bool = True):
        """`(C, dC/drho)` (`dC/drho` None without `grad`)."""
        torch = _torch()
        from mosaic import P

        low, high = self.task.LOW, self.task.HIGH
        r = torch.as_tensor(np.asarray(rho, np.float64)).requires_grad_(grad)
        model = self.model
        material = self.material.vectorize(model.n_elem)
        factor = high * (low / high + (1.0 - low / high) * torch.clamp(r, 0.0, 1.0) ** P)
        model.material = self._scale(material, factor)
        model.constraints = self.fixed
        self._load(model, self.load)
        with torch.set_grad_enabled(grad):
            u, *_ = model.solve(method=self.method,
                                differentiable_parameters=r if grad else None)
            C = torch.sum(self.load.ravel() * u[-1].ravel() if u.dim() > 2 else
                          self.load.ravel() * u.ravel())
        if not grad:
            return float(C), None
        (g,) = torch.autograd.grad(C, r)
        return float(C.detach()), g.numpy()


class TorchFemThermal(_TorchFem):
    """One mesh of `mosaic.Thermal(nx)` in torch-fem."""

    @staticmethod
    def _cells(task):
        from mosaic import LX, LY, mesh

        return mesh(task.nx, task.ny, 1, LX, LY, task.dz)[1]

    def _model(self, nodes, elements):
        from torchfem import SolidHeat
        from torchfem.materials import IsotropicConductivity3D

        material = IsotropicConductivity3D(kappa=1.0)
        return SolidHeat(nodes, elements, material), material

    @staticmethod
    def _scale(material, factor):
        material.KAPPA = factor[:, None, None] * material.KAPPA
        return material

    @staticmethod
    def _load(model, load):
        model.heat_flux = load


class TorchFemStructural(_TorchFem):
    """One mesh of `mosaic.Structural(nx, ...)` in torch-fem."""

    components = 3

    @staticmethod
    def _cells(task):
        from mosaic import LX, LY, LZ_S, mesh

        return mesh(task.nx, task.ny, task.nz, LX, LY, LZ_S)[1]

    def _model(self, nodes, elements):
        from torchfem import Solid
        from torchfem.materials import IsotropicElasticity3D
        from mosaic import NU

        material = IsotropicElasticity3D(E=1.0, nu=NU)
        return Solid(nodes, elements, material), material

    @staticmethod
    def _scale(material, factor):
        material.C = factor[:, None, None, None, None] * material.C
        return material

    @staticmethod
    def _load(model, load):
        model.forces = load
