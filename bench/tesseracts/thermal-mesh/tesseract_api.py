"""sciad as a Mosaic solver of the `thermal_mesh` task: a Tesseract API
module (tesseract-core; apply, JVP, VJP and abstract-eval endpoints) on
Mosaic's canonical thermal-mesh schema.

Steady heat conduction `K(rho) T = f` on the given HEX8 mesh, SIMP
conductivity `k = k_min + (k_max - k_min) clip(rho, 0, 1)^p_exp`
(`k_min = 1e-3 k_max`), Dirichlet temperatures and Neumann heat fluxes by
node groups, a lumped per-cell volumetric source; the outputs are the
thermal compliance `C = f_N . T` and the identification error
`sum (T - target_temperature)^2` (`sciad_hexmesh`). Derivatives in `rho`
and `source` are sciad's: the adjoint of the sparse solve (a factorization
shared with the forward solve), not finite differences.

The inputs and outputs have the field names, shapes and dtypes of Mosaic's
`mosaic_shared.problems.thermal_mesh` schemas (v0.2.0), written here so the
module does not need Mosaic's package; `k_max` and `p_exp` are the optional
material fields Mosaic's solvers add.
"""

from typing import Any

import numpy as np
from pydantic import BaseModel, Field
from tesseract_core.runtime import Array, Differentiable, Float32, ShapeDType

import sciad as sd
import sciad.numpy as snp
from sciad_hexmesh import (HEAT, HexMesh, Material, MeshBC, active, check_names, float64,
                           padded, problem_for)

DIFFERENTIABLE_INPUTS = ("rho", "source")
OUTPUTS = ("thermal_compliance", "identification_error")


class InputSchema(BaseModel):
    rho: Differentiable[Array[(None,), Float32]] = Field(
        description="Per-cell density, shape (n_max_cells,); active slice rho[:n_faces].")
    source: Differentiable[Array[(None,), Float32]] = Field(
        default_factory=lambda: np.zeros(1, np.float32),
        description="Per-cell volumetric heat source (active slice source[:n_faces]); "
                    "zeros or shorter than n_faces: none.")
    target_temperature: Array[(None,), Float32] = Field(
        default_factory=lambda: np.zeros(1, np.float32),
        description="Per-node target temperature of the identification error.")
    boundary_conditions: MeshBC
    hex_mesh: HexMesh
    k_max: float = Field(default=HEAT.e_max, description="SIMP k_max (k_min = 1e-3 k_max).")
    p_exp: float = Field(default=HEAT.p, description="SIMP exponent.")


class OutputSchema(BaseModel):
    thermal_compliance: Differentiable[Array[(), Float32]]
    identification_error: Differentiable[Array[(), Float32]]


def _setup(inputs: dict):
    """`(problem, (rho, source or None, target, k_max, p_exp))` of an input dict."""
    mesh = inputs["hex_mesh"]
    problem = problem_for(mesh, inputs["boundary_conditions"], components=1)
    m = problem.n_cells
    rho = active(inputs["rho"], m)
    source = np.asarray(inputs.get("source", np.zeros(1)), np.float64).ravel()
    source = source[:m] if source.size >= m else np.zeros(m)  # (the default: no source)
    target = np.asarray(inputs.get("target_temperature", np.zeros(1)), np.float64).ravel()
    target = target[:min(target.size, problem.n_nodes)]
    return problem, (rho, source, target, np.float64(inputs.get("k_max", HEAT.e_max)),
                     np.float64(inputs.get("p_exp", HEAT.p)))


def _outputs(problem, rho, source, target, k_max, p_exp):
    """`(C, identification error)`, the sciad program."""
    material = Material(k_max, 1e-3 * k_max, p_exp)
    T = problem.displacement(rho, material, source)
    err = snp.sum((T[:target.shape[0]] - target) ** 2)
    return problem.compliance(T), err


def _programs(problem) -> dict:
    """The compiled programs of a mesh (built on first use, kept with it)."""
    if "_programs" not in problem.__dict__:
        def run(rho, source, target, k_max, p_exp):
            return _outputs(problem, rho, source, target, k_max, p_exp)

        def vjp(rho, source, target, k_max, p_exp, ct):
            def loss(r, s):
                c, e = run(r, s, target, k_max, p_exp)
                return ct[0] * c + ct[1] * e
            return sd.grad(loss, argnums=(0, 1))(rho, source)

        def jvp(rho, source, target, k_max, p_exp, drho, dsource):
            return sd.jvp(lambda r, s: run(r, s, target, k_max, p_exp), (rho, source),
                          (drho, dsource))[1]

        problem._programs = {"apply": sd.function(run), "vjp": sd.function(vjp),
                             "jvp": sd.function(jvp)}
    return problem._programs


@float64
def apply(inputs: InputSchema) -> OutputSchema:
    """The thermal compliance and identification error of `inputs`."""
    problem, args = _setup(inputs.model_dump())
    C, err = _programs(problem)["apply"](*args)
    return {"thermal_compliance": np.float32(C), "identification_error": np.float32(err)}


@float64
def vector_jacobian_product(inputs: InputSchema, vjp_inputs: set[str], vjp_outputs: set[str],
                            cotangent_vector: dict[str, Any]) -> dict[str, Any]:
    """Cotangents of `vjp_inputs` (padded like the inputs) from those of
    `vjp_outputs`."""
    check_names("thermal-mesh", vjp_inputs, vjp_outputs, DIFFERENTIABLE_INPUTS, OUTPUTS)
    d = inputs.model_dump()
    problem, args = _setup(d)
    ct = np.array([float(np.asarray(cotangent_vector.get(k, 0.0))) if k in vjp_outputs else 0.0
                   for k in OUTPUTS])
    g_rho, g_src = _programs(problem)["vjp"](*args, ct)
    sizes = {"rho": np.size(d["rho"]), "source": np.size(d["source"])}
    out = {}
    if "rho" in vjp_inputs:
        out["rho"] = padded(g_rho, sizes["rho"])
    if "source" in vjp_inputs:
        out["source"] = padded(g_src[:min(sizes["source"], problem.n_cells)], sizes["source"])
    return out


@float64
def jacobian_vector_product(inputs: InputSchema, jvp_inputs: set[str], jvp_outputs: set[str],
                            tangent_vector: dict[str, Any]) -> dict[str, Any]:
    """Tangents of `jvp_outputs` from those of `jvp_inputs`."""
    check_names("thermal-mesh", jvp_inputs, jvp_outputs, DIFFERENTIABLE_INPUTS, OUTPUTS)
    problem, args = _setup(inputs.model_dump())
    m = problem.n_cells
    tangents = []
    for k in DIFFERENTIABLE_INPUTS:
        t = np.asarray(tangent_vector[k], np.float64).ravel() if k in jvp_inputs else None
        tangents.append(np.zeros(m) if t is None or t.size < m else t[:m])
    dC, dE = _programs(problem)["jvp"](*args, *tangents)
    out = {"thermal_compliance": np.float32(dC), "identification_error": np.float32(dE)}
    return {k: out[k] for k in jvp_outputs}


def abstract_eval(abstract_inputs):
    """The outputs' shapes and dtypes (scalars, float32)."""
    return {k: ShapeDType(shape=(), dtype="float32") for k in OUTPUTS}
