"""sciad as a Mosaic solver of the `structural_mesh` task: a Tesseract API
module (tesseract-core; apply, JVP, VJP and abstract-eval endpoints) on
Mosaic's canonical structural-mesh schema.

Linear elasticity `K(rho) u = f` on the given HEX8 mesh, SIMP modulus
`E = E_min + (E_max - E_min) clip(rho, 0, 1)^p_exp` (`E_min = 1e-3 E_max`,
Poisson's ratio `nu`), Dirichlet displacements and Neumann tractions by node
groups (a traction times each loaded boundary face's area, a quarter to
each of its nodes: the surface integral, as Mosaic's traction solvers
apply it); the output is the compliance `C = f . u` (`sciad_hexmesh`). Its
derivative in `rho` is sciad's adjoint of the sparse solve.

The inputs and outputs have the field names, shapes and dtypes of Mosaic's
`mosaic_shared.problems.structural_mesh` schemas (v0.2.0); `E_max`,
`p_exp` and `nu` are optional material fields (Mosaic's defaults:
70,000, 3, 0.3).
"""

from typing import Any

import numpy as np
from pydantic import BaseModel, Field
from tesseract_core.runtime import Array, Differentiable, Float32, ShapeDType

import sciad as sd
from sciad_hexmesh import (ELASTIC, HexMesh, Material, MeshBC, active, check_names, float64,
                           padded, problem_for)

DIFFERENTIABLE_INPUTS = ("rho",)
OUTPUTS = ("compliance",)


class InputSchema(BaseModel):
    rho: Differentiable[Array[(None,), Float32]] = Field(
        description="Per-cell density, shape (n_max_cells,); active slice rho[:n_faces].")
    boundary_conditions: MeshBC
    hex_mesh: HexMesh
    E_max: float = Field(default=ELASTIC.e_max, description="SIMP E_max (E_min = 1e-3 E_max).")
    p_exp: float = Field(default=ELASTIC.p, description="SIMP exponent.")
    nu: float = Field(default=ELASTIC.nu, description="Poisson's ratio.")


class OutputSchema(BaseModel):
    compliance: Differentiable[Array[(), Float32]]


def _setup(inputs: dict):
    nu = float(inputs.get("nu", ELASTIC.nu))
    if not -1.0 < nu < 0.5:
        raise ValueError(f"structural-mesh (sciad): Poisson's ratio nu must lie in (-1, 0.5), "
                         f"got {nu}")
    problem = problem_for(inputs["hex_mesh"], inputs["boundary_conditions"], components=3,
                          nu=nu)
    rho = active(inputs["rho"], problem.n_cells)
    return problem, rho, np.float64(inputs.get("E_max", ELASTIC.e_max)), \
        np.float64(inputs.get("p_exp", ELASTIC.p))


def _programs(problem) -> dict:
    """The compiled programs of a mesh (built on first use, kept with it)."""
    if "_programs" not in problem.__dict__:
        def run(rho, e_max, p):
            # (the element matrices carry nu: the law gives E alone)
            return problem.compliance(problem.displacement(rho, Material(e_max, 1e-3 * e_max, p)))

        problem._programs = {
            "apply": sd.function(run),
            "vjp": sd.function(lambda rho, e_max, p, ct: ct * sd.grad(run)(rho, e_max, p)),
            "jvp": sd.function(lambda rho, e_max, p, d: sd.jvp(
                lambda r: run(r, e_max, p), (rho,), (d,))[1]),
        }
    return problem._programs


@float64
def apply(inputs: InputSchema) -> OutputSchema:
    """The compliance of `inputs`."""
    problem, rho, e_max, p = _setup(inputs.model_dump())
    return {"compliance": np.float32(_programs(problem)["apply"](rho, e_max, p))}


@float64
def vector_jacobian_product(inputs: InputSchema, vjp_inputs: set[str], vjp_outputs: set[str],
                            cotangent_vector: dict[str, Any]) -> dict[str, Any]:
    """The cotangent of `rho` (padded like it) from that of the compliance."""
    check_names("structural-mesh", vjp_inputs, vjp_outputs, DIFFERENTIABLE_INPUTS, OUTPUTS)
    d = inputs.model_dump()
    problem, rho, e_max, p = _setup(d)
    if "rho" not in vjp_inputs:
        return {}
    ct = float(np.asarray(cotangent_vector.get("compliance", 0.0))) \
        if "compliance" in vjp_outputs else 0.0
    g = _programs(problem)["vjp"](rho, e_max, p, np.float64(ct))
    return {"rho": padded(g, np.size(d["rho"]))}


@float64
def jacobian_vector_product(inputs: InputSchema, jvp_inputs: set[str], jvp_outputs: set[str],
                            tangent_vector: dict[str, Any]) -> dict[str, Any]:
    """The compliance's tangent from that of `rho`."""
    check_names("structural-mesh", jvp_inputs, jvp_outputs, DIFFERENTIABLE_INPUTS, OUTPUTS)
    problem, rho, e_max, p = _setup(inputs.model_dump())
    t = np.zeros(problem.n_cells) if "rho" not in jvp_inputs else \
        active(tangent_vector["rho"], problem.n_cells)
    dC = _programs(problem)["jvp"](rho, e_max, p, t)
    return {k: np.float32(dC) for k in jvp_outputs}


def abstract_eval(abstract_inputs):
    """The output's shape and dtype (a float32 scalar)."""
    return {"compliance": ShapeDType(shape=(), dtype="float32")}
