"""sciad as a Mosaic solver: the Tesseract API modules of the thermal_mesh and
structural_mesh tasks (bench/tesseracts), their endpoints called in-process
through tesseract-core (`Tesseract.from_tesseract_api`; the container build
needs Docker), against Mosaic's shipped references, SciPy and finite
differences."""

import os
import sys

import numpy as np
import pytest

tesseract_core = pytest.importorskip("tesseract_core")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "bench", "tesseracts")
sys.path.insert(0, os.path.join(HERE, "sciad_hexmesh"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import mosaic  # noqa: E402  (bench/mosaic.py: the mesh and Mosaic's references)
import sciad_hexmesh  # noqa: E402


def _module(task: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        f"sciad_{task.replace('-', '_')}_api", os.path.join(HERE, task, "tesseract_api.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


THERMAL_API = _module("thermal-mesh")
STRUCTURAL_API = _module("structural-mesh")


@pytest.fixture(autouse=True)
def _float64():
    """The tests' own float64 programs (finite differences): in JAX's 64-bit
    scope, as the endpoints run."""
    import jax

    with jax.enable_x64(True):
        yield


@pytest.fixture(scope="module")
def thermal():
    return tesseract_core.Tesseract.from_tesseract_api(THERMAL_API)


@pytest.fixture(scope="module")
def structural():
    return tesseract_core.Tesseract.from_tesseract_api(STRUCTURAL_API)


def _inputs(nx, ny, nz, lz, rho, flux, dirichlet=None):
    """Mosaic's canonical inputs on its structured slab: clamped (or cold)
    at x = 0, the flux or traction `flux` (one group) on x = 2."""
    points, cells = mosaic.mesh(nx, ny, nz, 2.0, 1.0, lz)
    left = (points[:, 0] < 2e-6).astype(np.int32)
    right = (points[:, 0] > 2.0 - 2e-6).astype(np.int32)
    d = {"mask": left} if dirichlet is None else {"mask": left, "values": dirichlet}
    return {"rho": np.asarray(rho, np.float32),
            "hex_mesh": {"points": points.astype(np.float32), "faces": cells.astype(np.int32),
                         "n_points": points.shape[0], "n_faces": cells.shape[0]},
            "boundary_conditions": {"dirichlet": d, "neumann": {
                "mask": right, "values": np.array([flux], np.float32)}}}


def _thermal_inputs(nx, rho, **kw):
    lz = 2.0 / nx
    return _inputs(nx, nx // 2, 1, lz, rho, [1.0 / lz], **kw)


def _structural_inputs(n, rho):
    return _inputs(n, 2, n // 2, 1.0, rho, [0.0, 0.0, -1.0])


def test_thermal_apply_matches_mosaics_references(thermal):
    ref = mosaic.REFERENCES["agreement"]
    for rho0, C in list(zip(ref["sweep"], ref["C"]))[::3]:
        out = thermal.apply(_thermal_inputs(16, np.full(128, rho0)))
        assert abs(float(out["thermal_compliance"]) / C - 1) < 2e-7
        assert float(out["identification_error"]) == 0.0  # (the default target: T at a cold node)


def test_thermal_vjp_is_the_hand_adjoint_and_jvp_its_transpose(thermal):
    rho = mosaic.random_density(8, 4, 1, seed=3)
    inp = _thermal_inputs(8, rho)
    C, g = mosaic.Thermal(8).scipy_value_and_grad(np.asarray(inp["rho"], np.float64))
    assert abs(float(thermal.apply(inp)["thermal_compliance"]) / C - 1) < 1e-6
    v = thermal.vector_jacobian_product(inp, {"rho"}, {"thermal_compliance"},
                                        {"thermal_compliance": np.float32(2.0)})
    np.testing.assert_allclose(v["rho"], 2.0 * g, rtol=1e-5, atol=1e-6 * np.abs(g).max())
    d = np.random.default_rng(0).standard_normal(rho.size).astype(np.float32)
    j = thermal.jacobian_vector_product(inp, {"rho"}, {"thermal_compliance"}, {"rho": d})
    assert abs(float(j["thermal_compliance"]) - g @ d) <= 1e-5 * np.abs(g) @ np.abs(d)


def test_thermal_source_and_identification_gradients_match_central_differences(thermal):
    """The identification error's gradient in rho and source (padded inputs:
    the padding's cotangent is zero) against central differences of the
    float64 program."""
    rng = np.random.default_rng(1)
    m = 16  # nx = 8: 8 x 4 cells
    inp = _thermal_inputs(8, np.concatenate([0.3 + 0.6 * rng.random(m * 2), [0.7, 0.7]]))
    n = inp["hex_mesh"]["n_points"]
    inp["source"] = np.concatenate([rng.random(32), [9.0]]).astype(np.float32)
    inp["target_temperature"] = rng.random(n).astype(np.float32)
    v = thermal.vector_jacobian_product(inp, {"rho", "source"}, {"identification_error"},
                                        {"identification_error": np.float32(1.0)})
    assert v["rho"].shape == (34,) and v["source"].shape == (33,)
    assert v["rho"][32:].tolist() == [0.0, 0.0] and v["source"][32] == 0.0
    tm = THERMAL_API
    problem, (rho, src, target, kmax, p) = tm._setup(inp)

    def err(r, s):
        return float(tm._programs(problem)["apply"](r, s, target, kmax, p)[1])

    for name, x, g in (("rho", rho, v["rho"][:32]), ("source", src, v["source"][:32])):
        d = rng.standard_normal(32)
        h = 1e-5
        args = (lambda t: (x + t * d, src)) if name == "rho" else (lambda t: (rho, x + t * d))
        fd = (err(*args(h)) - err(*args(-h))) / (2 * h)
        assert abs(fd - g @ d) <= 1e-4 * max(abs(fd), 1e-12), name


def test_thermal_prescribed_temperatures_are_lifted(thermal):
    """A nonzero Dirichlet value (two groups): the compliance against a SciPy
    solve of the full system with the prescribed rows replaced, and its
    gradient (which then has the lifting's term) against central
    differences."""
    import scipy.sparse as sp
    import scipy.sparse.linalg as spla

    rng = np.random.default_rng(2)
    rho = 0.2 + 0.7 * rng.random(32)
    inp = _thermal_inputs(8, rho)
    pts = inp["hex_mesh"]["points"]
    mask = inp["boundary_conditions"]["dirichlet"]["mask"]
    mask = np.where(mask > 0, 1 + (pts[:, 1] > 0.5), 0).astype(np.int32)
    inp["boundary_conditions"]["dirichlet"] = {"mask": mask,
                                               "values": np.array([[0.5], [-1.0]], np.float32)}
    cells = inp["hex_mesh"]["faces"].astype(np.int64)
    Ke, _ = sciad_hexmesh.element_matrices(pts[cells[:1]].astype(np.float64), 1)
    k = 1e-3 + (1 - 1e-3) * rho.astype(np.float32).astype(np.float64) ** 3
    n = pts.shape[0]
    a, b = np.meshgrid(np.arange(8), np.arange(8), indexing="ij")
    K = sp.coo_matrix(((k[:, None] * Ke[0].ravel()).ravel(),
                       (cells[:, a.ravel()].ravel(), cells[:, b.ravel()].ravel())),
                      shape=(n, n)).tocsr()
    prob = sciad_hexmesh.problem_for(inp["hex_mesh"], inp["boundary_conditions"], 1)
    fixed = mask > 0
    u = np.zeros(n)
    u[fixed] = np.where(mask[fixed] == 1, 0.5, -1.0)
    free = ~fixed
    u[free] = spla.spsolve(K[free][:, free].tocsc(), prob.f_n[free] - K[free][:, fixed] @ u[fixed])
    C = prob.f_n @ u
    assert abs(float(thermal.apply(inp)["thermal_compliance"]) / C - 1) < 1e-6
    g = thermal.vector_jacobian_product(inp, {"rho"}, {"thermal_compliance"},
                                        {"thermal_compliance": np.float32(1.0)})["rho"]
    tm = THERMAL_API
    problem, (r, s, target, kmax, p) = tm._setup(inp)
    d = rng.standard_normal(32)
    f = tm._programs(problem)["apply"]
    fd = (float(f(r + 1e-6 * d, np.zeros(32), target, kmax, p)[0])
          - float(f(r - 1e-6 * d, np.zeros(32), target, kmax, p)[0])) / 2e-6
    assert abs(fd - g @ d) <= 1e-4 * abs(fd)


def test_structural_apply_matches_mosaics_references(structural):
    # forward_agreement.npz: N = 8 (8 x 2 x 4 cells), uniform rho
    for rho0, C in ((0.2, 0.0556488), (0.9, 0.00068615656)):
        out = structural.apply(_structural_inputs(8, np.full(64, rho0)))
        assert abs(float(out["compliance"]) / C - 1) < 1e-6


def test_structural_vjp_matches_central_differences_and_the_jvp(structural):
    rng = np.random.default_rng(4)
    rho = 0.3 + 0.6 * rng.random(16)  # N = 4: 4 x 2 x 2 cells
    inp = _structural_inputs(4, rho)
    g = structural.vector_jacobian_product(inp, {"rho"}, {"compliance"},
                                           {"compliance": np.float32(1.0)})["rho"]
    sm = STRUCTURAL_API
    problem, r, e_max, p = sm._setup(inp)
    run = sm._programs(problem)["apply"]
    d = rng.standard_normal(16)
    fd = (float(run(r + 1e-6 * d, e_max, p)) - float(run(r - 1e-6 * d, e_max, p))) / 2e-6
    assert abs(fd - g @ d) <= 1e-5 * abs(fd)
    j = structural.jacobian_vector_product(inp, {"rho"}, {"compliance"},
                                           {"rho": d.astype(np.float32)})["compliance"]
    assert abs(float(j) - g @ d) <= 1e-5 * abs(g @ d)


def test_general_cells_match_a_scipy_solve_of_the_same_matrices():
    """Cells that are not translates of one another (the nodes moved): each
    cell's own element matrix; the compliance against SciPy on the same
    element matrices, and a rigid rotation of the mesh leaves the
    conductance compliance unchanged."""
    import scipy.sparse as sp
    import scipy.sparse.linalg as spla

    import sciad as sd

    rng = np.random.default_rng(5)
    inp = _thermal_inputs(6, np.full(18, 0.6))
    pts = inp["hex_mesh"]["points"].astype(np.float64)
    inner = (pts[:, 0] > 1e-6) & (pts[:, 0] < 2 - 1e-6)
    pts[inner, :2] += 0.05 * rng.standard_normal((inner.sum(), 2)) * (2 / 6)
    cells = inp["hex_mesh"]["faces"].astype(np.int64)
    bc = inp["boundary_conditions"]
    prob = sciad_hexmesh.HexProblem(pts, cells, bc, 1)
    assert prob.Ke.shape[0] == cells.shape[0]
    C = float(sd.function(lambda r: prob.compliance(
        prob.displacement(r, sciad_hexmesh.HEAT)))(np.full(18, 0.6)))
    Ke, _ = sciad_hexmesh.element_matrices(pts[cells], 1)
    k = 1e-3 + (1 - 1e-3) * 0.6 ** 3
    n = pts.shape[0]
    a, b = np.meshgrid(np.arange(8), np.arange(8), indexing="ij")
    K = sp.coo_matrix((k * Ke.reshape(18, -1).ravel(),
                       (cells[:, a.ravel()].ravel(), cells[:, b.ravel()].ravel())),
                      shape=(n, n)).tocsr()
    free = ~(bc["dirichlet"]["mask"] > 0)
    u = spla.spsolve(K[free][:, free].tocsc(), prob.f_n[free])
    assert abs(C / (prob.f_n[free] @ u) - 1) < 1e-10
    R = np.linalg.qr(rng.standard_normal((3, 3)))[0]
    R *= np.sign(np.linalg.det(R))
    turned = sciad_hexmesh.HexProblem(pts @ R.T, cells, bc, 1)
    np.testing.assert_allclose(turned.Ke, prob.Ke, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(turned.f_n, prob.f_n, rtol=1e-12)


def test_bad_inputs_are_refused(thermal, structural):
    inp = _structural_inputs(4, np.full(16, 0.5))
    with pytest.raises(Exception, match="Input should be 'rho'"):  # (the runtime's check)
        structural.vector_jacobian_product(inp, {"hex_mesh"}, {"compliance"},
                                           {"compliance": np.float32(1.0)})
    with pytest.raises(ValueError, match="differentiable inputs are .'rho',. and outputs"):
        STRUCTURAL_API.vector_jacobian_product(  # (the module's own, called directly)
            STRUCTURAL_API.InputSchema.model_validate(inp), {"nu"}, {"compliance"},
            {"compliance": 1.0})
    short = dict(inp, rho=np.full(3, 0.5, np.float32))
    with pytest.raises(Exception, match="n_faces = 16"):
        structural.apply(short)
    flipped = _thermal_inputs(4, np.full(8, 0.5))
    flipped["hex_mesh"]["faces"] = flipped["hex_mesh"]["faces"][:, [4, 5, 6, 7, 0, 1, 2, 3]]
    with pytest.raises(Exception, match="inverted or degenerate"):
        thermal.apply(flipped)
    two = _thermal_inputs(4, np.full(8, 0.5))
    two["boundary_conditions"]["neumann"]["mask"] *= 2
    with pytest.raises(Exception, match="names group 2"):
        thermal.apply(two)


@pytest.mark.parametrize("task", ["thermal-mesh", "structural-mesh"])
def test_build_context_is_complete(task, tmp_path):
    """What `tesseract build` makes before Docker runs (no Docker here): the
    config parses, the requirements name the wheel of this sciad's version,
    and the local requirements are staged into the context."""
    import shutil
    from pathlib import Path

    from tesseract_core.sdk.api_parse import get_config
    from tesseract_core.sdk.engine import prepare_build_context

    import sciad

    for part in (task, "sciad_hexmesh"):
        shutil.copytree(os.path.join(HERE, part), tmp_path / part)
    src = tmp_path / task
    lines = [s.strip() for s in (src / "tesseract_requirements.txt").read_text().splitlines()
             if s.strip() and not s.startswith("#")]
    assert lines == [f"../wheel/sciad-{sciad.__version__}-py3-none-any.whl", "../sciad_hexmesh"]
    (tmp_path / "wheel").mkdir()
    (tmp_path / "wheel" / f"sciad-{sciad.__version__}-py3-none-any.whl").write_bytes(b"")
    config = get_config(Path(src))
    assert config.name == "sciad_" + task.replace("-", "_")
    context = tmp_path / "context"
    prepare_build_context(Path(src), context, config)
    staged = sorted(p.name for p in (context / "local_requirements").iterdir())
    assert staged == [f"sciad-{sciad.__version__}-py3-none-any.whl", "sciad_hexmesh"]
    assert (context / "local_requirements" / "sciad_hexmesh" / "sciad_hexmesh.py").is_file()
    assert "g++" in (context / "Dockerfile").read_text()
