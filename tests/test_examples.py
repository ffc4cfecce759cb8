"""The examples run end to end (on smaller sizes) and check themselves."""

from __future__ import annotations

import functools
import importlib.util
import os

import numpy as np
import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples")


@functools.cache
def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_quickstart_matches_numpy(capsys):
    _load("quickstart").main(n_calls=3)
    out = capsys.readouterr().out
    assert "graph step(%u: f64[256], %dt: f64[])" in out
    assert "(traced 1x)" in out
    assert "identical text: True" in out



def test_custom_primitive_fits_robustly(capsys):
    ex = _load("custom_primitive")
    robust, plain = ex.main()
    assert np.max(np.abs(robust.x - ex.TRUE)) < 0.03
    assert np.max(np.abs(plain.x - ex.TRUE)) > 3 * np.max(np.abs(robust.x - ex.TRUE))
    assert "check_rules(pseudo_huber)" in capsys.readouterr().out


def test_custom_primitive_rules(rng):
    ex = _load("custom_primitive")
    import sciad as sd

    sd.testing.check_rules(ex.pseudo_huber_p, rng.standard_normal(20) * 3, delta=0.4)


def test_example_objectives_pass_the_taylor_test(rng):
    import sciad as sd

    ex = _load("custom_primitive")
    data = ex.make_data(3)
    theta = ex.TRUE + 0.2 * rng.standard_normal(3)
    for loss in (ex.objective, ex.least_squares):
        rates = sd.testing.taylor_test(lambda th: loss(th, data), theta,
                                       rng.standard_normal(3))
        assert np.all(np.abs(rates - 2.0) < 0.15), (loss.__name__, rates)


# slow: its Taylor test of the objective is test_inverse_poisson_objective_taylor_and_one_factorization's
@pytest.mark.slow
def test_inverse_poisson_recovers_the_field(capsys):
    ex = _load("inverse_poisson")
    res, rates, history, m_true = ex.main(n=16, maxiter=60, plot=None)
    assert np.all(np.abs(rates - 2.0) < 0.1), rates
    assert history[-1] < 0.2 * history[0]
    err0 = np.linalg.norm(m_true)  # the start is m = 0
    assert np.linalg.norm(res.x - m_true) < 0.9 * err0
    out = capsys.readouterr().out
    assert "Taylor test" in out and "iter   1" in out and "done:" in out


def test_inverse_poisson_objective_taylor_and_one_factorization(rng):
    import sciad as sd

    ex = _load("inverse_poisson")
    problem = ex.Problem(12)
    data, sigma = ex.make_data(problem)
    m = 0.2 * rng.standard_normal(144)
    f = lambda m: ex.objective(m, data, sigma, problem)  # noqa: E731
    rates = sd.testing.taylor_test(f, m, rng.standard_normal(144))
    assert np.all(np.abs(rates - 2.0) < 0.1), rates
    g = sd.graph.passes.optimize(sd.trace(sd.value_and_grad(f), m))
    factors = [n for n in g.nodes if "factor" in n.primitive.name]
    assert len(factors) == 1, g.pretty(source=False)


# slow: the objective's Taylor test and its gradient against jax.grad (to 1e-11)
# are test_spectral_inverse_heat_objective_taylor_grad_and_fold's
@pytest.mark.slow
def test_spectral_inverse_heat_reaches_the_closed_form_minimizer(capsys):
    ex = _load("spectral_inverse_heat")
    res, rates, history, u_true, exact = ex.main(n=32, maxiter=600, plot=None)
    assert np.all(np.abs(rates - 2.0) < 0.1), rates
    # L-BFGS on sciad's gradients lands on the minimizer computed with numpy.fft
    gap = np.linalg.norm(res.x - exact) / np.linalg.norm(exact)
    assert gap < 1e-5, gap
    assert np.linalg.norm(res.x - u_true) < 0.6 * np.linalg.norm(u_true)
    out = capsys.readouterr().out
    assert "Taylor test" in out and "closed-form Tikhonov minimizer" in out


def test_spectral_inverse_heat_objective_taylor_grad_and_fold(rng):
    import jax
    import jax.numpy as jnp

    import sciad as sd

    ex = _load("spectral_inverse_heat")
    problem = ex.Problem(16, steps=3)
    data, sigma = ex.make_data(problem)
    u = rng.standard_normal((16, 16))
    f = lambda u: ex.objective(u, data, sigma, problem)  # noqa: E731
    rates = sd.testing.taylor_test(f, u, rng.standard_normal((16, 16)))
    assert np.all(np.abs(rates - 2.0) < 0.1), rates
    # the same code on jax.numpy: the gradient the benchmark compares against
    with jax.enable_x64(True):
        want = np.asarray(jax.grad(lambda u: ex.objective(u, data, sigma, problem, jnp))(u))
    np.testing.assert_allclose(np.asarray(sd.grad(f)(u)), want, rtol=1e-11,
                               atol=1e-11 * np.abs(want).max())
    # one rfft2/irfft2 pair per step and for the blur, and their adjoints
    g = sd.graph.passes.optimize(sd.trace(sd.value_and_grad(f), u))
    kinds = [n.params["kind"] for n in g.nodes if n.primitive.name == "fft"]
    assert sorted(set(kinds)) == ["irfft", "irfft_adjoint", "rfft", "rfft_adjoint"]
    assert len(kinds) == 4 * (problem.steps + 1)


def test_wave_inversion_fits_the_traces_with_checkpoints(capsys):
    ex = _load("wave_inversion")
    res, rates, history, m_true = ex.main(n=24, steps=160, shots=2, maxiter=6, plot=None)
    assert np.all(np.abs(rates - 2.0) < 0.1), rates
    out = capsys.readouterr().out
    start = float(out.split("(from ")[1].split(")")[0])  # the objective at m = 0
    assert res.fun < 0.05 * start, (res.fun, start)
    assert np.linalg.norm(res.x - m_true) < np.linalg.norm(m_true)
    lines = [ln for ln in out.splitlines() if ln.startswith("gradient memory")]
    assert len(lines) == 2 and "binomial(" in lines[1]
    peaks = [float(ln.split("peak ")[1].split(" MiB")[0]) for ln in lines]
    assert peaks[1] < 0.5 * peaks[0]  # checkpointing bounds the gradient's memory


def test_wave_inversion_checkpointed_gradient_equals_store_all(rng):
    import sciad as sd

    ex = _load("wave_inversion")
    survey = ex.Survey(16, 60, 2)
    data = np.asarray(sd.function(lambda m: ex.simulate(survey, ex.velocity(survey, m)))(
        0.1 * rng.standard_normal(256)))
    m = 0.05 * rng.standard_normal(256)
    g_all = sd.grad(lambda m: ex.objective(m, data, survey, None))(m)
    g_ck = sd.grad(lambda m: ex.objective(m, data, survey, 4))(m)
    np.testing.assert_allclose(g_ck, g_all, rtol=1e-12, atol=1e-15 * np.max(np.abs(g_all)))
    # a memory budget (the example's --budget): five wavefields' carries of 8 KiB
    budget = sd.MemoryBudget(ram="41KiB")
    g_b = sd.grad(lambda m: ex.objective(m, data, survey, budget))(m)
    np.testing.assert_allclose(g_b, g_all, rtol=1e-12, atol=1e-15 * np.max(np.abs(g_all)))
    note = [row.note for row in sd.cost(sd.grad(lambda m: ex.objective(m, data, survey, budget)),
                                        m).rows if "budget" in row.note]
    assert note and "binomial(3) for a 41.0 KiB budget" in note[0], note


def _multi_source(n=10, sources=4):
    ex = _load("multi_source_inversion")
    problem = ex.Problem(n, sources)
    data, sigma = ex.make_data(problem)
    return ex, problem, data, sigma


def test_multi_source_objective_taylor_and_one_factorization(rng):
    import sciad as sd

    ex, problem, data, sigma = _multi_source(12, 4)
    N = 144
    f = lambda m: ex.objective(m, problem.F, data, sigma, problem)  # noqa: E731
    rates = sd.testing.taylor_test(f, 0.2 * rng.standard_normal(N), rng.standard_normal(N))
    assert np.all(np.abs(rates - 2.0) < 0.1), rates
    # the batch of sources against one matrix: one factorization, shared by the
    # forward and the adjoint solve, each one solve with a block of 4 columns
    g = sd.graph.passes.optimize(sd.trace(sd.value_and_grad(f), np.zeros(N)))
    assert ex.factorizations(g) == ["linalg.factor"], g.pretty(source=False)
    solves = [nd for nd in g.nodes if nd.primitive.name == "linalg.backsolve"]
    assert len(solves) == 2 and all(nd.outputs[0].type.shape == (N, 4) for nd in solves)


def test_multi_source_gradient_is_the_sum_over_sources(rng):
    import sciad as sd
    import sciad.numpy as snp

    ex, problem, data, sigma = _multi_source(10, 4)
    F, m = problem.F, 0.2 * rng.standard_normal(100)
    f = lambda m: ex.objective(m, F, data, sigma, problem)  # noqa: E731
    one = sd.function(sd.grad(lambda m, f, d: ex.source_misfit(problem, m, f, d, sigma)))
    per_source = [np.asarray(one(m, F[s], data[s])) for s in range(4)]
    reg = sd.grad(lambda m: 0.5 * ex.ALPHA * (
        snp.sum(snp.diff(snp.reshape(m, (10, 10)), axis=1) ** 2)
        + snp.sum(snp.diff(snp.reshape(m, (10, 10)), axis=0) ** 2)))(m)
    want = sum(per_source) / data.size + np.asarray(reg)
    f_and_grad = sd.function(sd.value_and_grad(f))
    got = np.asarray(f_and_grad(m)[1])
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12 * np.abs(want).max())
    # each ensemble member its own medium: a batch of matrices on one pattern,
    # one map of factorizations; values and gradients equal a loop over media
    Ms = 0.2 * rng.standard_normal((3, 100))
    ens = lambda Ms: snp.sum(ex.ensemble_objective(Ms, F, data, sigma, problem))  # noqa: E731
    g = sd.graph.passes.optimize(sd.trace(sd.value_and_grad(ens), Ms))
    assert ex.factorizations(g) == ["map[linalg.factor]"], g.pretty(source=False)
    values = np.asarray(sd.function(
        lambda Ms: ex.ensemble_objective(Ms, F, data, sigma, problem))(Ms))
    loop = [f_and_grad(M) for M in Ms]
    np.testing.assert_allclose(values, [float(v) for v, _ in loop], rtol=1e-12)
    np.testing.assert_allclose(np.asarray(sd.grad(ens)(Ms)),
                               np.stack([np.asarray(g) for _, g in loop]),
                               rtol=1e-10, atol=1e-12)


# slow: what main() shows is checked by default elsewhere: the Taylor test and the
# one factorization by test_multi_source_objective_taylor_and_one_factorization, the
# ensemble's map of factorizations by test_multi_source_gradient_is_the_sum_over_sources,
# the sharded value and gradient by test_multi_source_sharded_equals_unsharded
@pytest.mark.slow
def test_multi_source_inversion_reduces_the_misfit(capsys):
    ex = _load("multi_source_inversion")
    res, rates, history, m_true, start = ex.main(n=12, sources=4, maxiter=15, ensemble=3)
    assert np.all(np.abs(rates - 2.0) < 0.1), rates
    assert history[-1] < 0.3 * start, (history[-1], start)
    out = capsys.readouterr().out
    assert "factorization nodes: 1 (linalg.factor) for 4 sources" in out
    assert "map[linalg.factor]" in out and "Taylor test" in out and "done:" in out
    assert "sharded over 1 device(s)" in out  # a mesh of one device


_MULTI_SOURCE_CHILD = r'''
import importlib.util, json, os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, numpy as np
import sciad as sd
spec = importlib.util.spec_from_file_location("ex", sys.argv[1])
ex = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ex)
problem = ex.Problem(10, 8)
data, sigma = ex.make_data(problem)
m = 0.2 * np.random.default_rng(0).standard_normal(100)
want_v, want_g = sd.value_and_grad(lambda m: ex.objective(m, problem.F, data, sigma, problem))(m)
fn, put = ex.sharded_value_and_grad(problem, sigma)
F, D = put(problem.F), put(data)
v, g = fn(m, F, D)
print("RESULT " + json.dumps({
    "devices": len(jax.devices()), "F_devices": len(F.sharding.device_set),
    "v_err": abs(float(v) - float(want_v)) / abs(float(want_v)),
    "g_err": float(np.max(np.abs(np.asarray(g) - np.asarray(want_g)))
                   / np.max(np.abs(np.asarray(want_g))))}))
'''


def test_multi_source_sharded_equals_unsharded():
    import json
    import subprocess
    import sys

    path = os.path.join(EXAMPLES, "multi_source_inversion.py")
    proc = subprocess.run([sys.executable, "-c", _MULTI_SOURCE_CHILD, path],
                          capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    r = json.loads(lines[-1][len("RESULT "):])
    assert r["devices"] == r["F_devices"] == 4
    assert r["v_err"] < 1e-13 and r["g_err"] < 1e-12, r


def test_ensemble_inversion_one_process(capsys, tmp_path):
    """The ensemble example in this process (one device): the Taylor test, a
    progress line per batch, every objective reduced, the summary file."""
    import json

    ex = _load("ensemble_inversion")
    path = tmp_path / "summary.json"
    out = ex.main(n=8, sources=2, problems=4, batch=2, iters=6, summary=str(path))
    assert out["processes"] == 1 and out["devices"] == 1
    (taylor,) = out["taylor"]
    assert taylor["problem"] == 0 and np.all(np.abs(np.array(taylor["rates"]) - 2.0) < 0.1)
    f0, f = np.array(out["f0"]), np.array(out["f"])
    assert f0.shape == f.shape == (4,) and np.all(f < 0.5 * f0), (f0, f)
    err = np.array(out["err"])
    assert np.median(err) < 0.9, err  # nearer the truth than m = 0 (error 1), mostly
    # the problems are the same whatever the batch: problem i's medium is
    # made from its index alone
    problem = ex._ms.Problem(8, 2)
    np.testing.assert_array_equal(out["m_true"][3], ex.true_media(problem, np.array([3]))[0])
    text = capsys.readouterr().out.splitlines()
    assert text[0].startswith("ensemble inversion: 4 problems (8 x 8 grid, 2 sources")
    assert [ln.split(":")[0] for ln in text if ln.startswith("batch")] == ["batch 1/2",
                                                                         "batch 2/2"]
    assert any(ln.startswith("batch 2/2: problems 2-3, objective") for ln in text)
    assert text[-1].startswith("summary written")
    # one device: the layout, but no devices line from sd.cost
    assert any(ln.startswith("layout: data (2, 2, 9) split as P('batch',) over 1 devices")
               for ln in text) and not any(ln.startswith("sd.cost") for ln in text)
    saved = json.loads(path.read_text())
    assert saved["problems"] == 4 and saved["f"] == out["f"] and "m" not in saved


def test_ensemble_inversion_refuses_partial_batches():
    import sciad as sd

    ex = _load("ensemble_inversion")
    with pytest.raises(sd.errors.InvalidOptionError, match="5 problems do not make whole "
                       "batches of 2"):
        ex.main(n=8, sources=2, problems=5, batch=2)


_ENSEMBLE_ARGS = ["--n", "8", "--sources", "2", "--problems", "8", "--batch", "4",
                  "--iters", "6", "--devices", "4", "--check"]


@pytest.mark.slow
def test_ensemble_inversion_on_four_simulated_devices_equals_one_device(tmp_path):
    """The script as a user runs it, 4 simulated CPU devices (`--devices`
    sets XLA_FLAGS before JAX starts): sharded, then checked against one
    device (`--check` raises if they differ)."""
    import json
    import subprocess
    import sys

    path = os.path.join(EXAMPLES, "ensemble_inversion.py")
    summary = tmp_path / "s.json"
    root = os.path.dirname(EXAMPLES)  # this checkout's sciad, not an installed one
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, path, *_ENSEMBLE_ARGS, "--summary", str(summary)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "1 process(es), 4 devices (4 on this process, cpu)" in proc.stdout
    assert "check: one device, unsharded, gives the same m" in proc.stdout
    assert ("layout: data (4, 2, 9) split as P('batch',) over 4 devices, 1 problem(s) per device; "
            "process 0 problems 0-3 (4 devices)") in proc.stdout
    assert "sd.cost of a step: the arguments are laid out over 4, at most 1.6 KiB" in proc.stdout
    saved = json.loads(summary.read_text())
    assert saved["devices"] == 4 and saved["check"]["m"] < 1e-8


def test_eigen_design_raises_the_fundamental_and_opens_the_gap(capsys):
    ex = _load("eigen_design")
    out = ex.main(n=16, maxiter=8, plot=None)
    for name, r in out["rates"].items():
        assert np.all(np.abs(r - 2.0) < 0.1), (name, r)
    w0, w1, w2 = out["w0"], out["w1"], out["w2"]
    # the uniform square: lambda_2 = lambda_3 (the degenerate case), close to
    # the continuum's 2 pi^2 and 5 pi^2
    assert abs(w0[2] - w0[1]) < 1e-9 * w0[1]
    np.testing.assert_allclose(w0[:3], np.pi ** 2 * np.array([2.0, 5.0, 5.0]), rtol=0.03)
    assert w1[0] > 1.3 * w0[0]
    assert (w2[1] + w2[2]) / (2 * w2[0]) > 1.3 * (w0[1] + w0[2]) / (2 * w0[0])
    mem = ex.Membrane(16)
    for res in (out["res1"], out["res2"]):  # the mass budget holds
        np.testing.assert_allclose(np.mean(ex.mem_density(mem, res.x)), 1.0, rtol=1e-12)
        assert np.all(np.abs(res.x) <= ex.BOUND + 1e-12)
    text = capsys.readouterr().out
    assert "DegenerateEigenvalueError" in text and "eigenvalues 1..2" in text


def test_nonlinear_inverse_recovers_the_coefficient(capsys):
    ex = _load("nonlinear_inverse")
    res, rates, history, m_true, graph = ex.main(n=16, maxiter=25, plot=None)
    assert np.all(np.abs(rates - 2.0) < 0.1), rates
    assert history[-1] < 0.5 * history[0]
    err = np.linalg.norm(res.x - m_true) / np.linalg.norm(m_true)
    assert err < 0.8, err
    # the state is one root node, its Jacobian's 5-point pattern detected
    roots = [n for n in graph.nodes if n.primitive.name == "optimize.root"]
    assert len(roots) == 1
    p = roots[0].params["pattern"]
    assert p.shape == (256, 256) and p.nnz == 5 * 256 - 4 * 16
    out = capsys.readouterr().out
    assert "optimize.root[" in out and "pattern=#" in out and "nnz=1216" in out
    assert "colors" in out and "Taylor test" in out


@pytest.mark.slow
def test_ode_fit_passes_its_taylor_tests_and_shows_the_sparse_jacobian(capsys):
    """Both fits, few iterations, a small Brusselator: the Taylor tests, a
    falling objective, and the detected pattern of the Newton matrices."""
    ex = _load("ode_fit")
    out = ex.main(n=8, maxiter=3, plot=None)
    for name in ("kinetics", "brusselator"):
        res, rates, history = out[name][:3]
        assert np.all(np.abs(rates - 2.0) < 0.15), (name, rates)
        assert history[-1] < history[0]
    node = out["brusselator"][4]
    assert node.params["jac"] == "sparse"
    # u and v interleaved: a band of width 5 (each cell's pair, its neighbours' same
    # species), plus the diagonal
    assert node.params["pattern"].nnz == 16 + 2 * 8 + 2 * 2 * 7
    text = capsys.readouterr().out
    assert "detected Jacobian of f plus the diagonal: 16 x 16" in text
    assert "Taylor test" in text and "ode.odeint[" in text


def _krylov_preconditioner() -> str:
    """"amg" where sciad has the AMG preconditioner, else "jacobi"."""
    from sciad.solvers import _registry

    try:
        return "amg" if "amg" in _registry.names("preconditioner") else "jacobi"
    except Exception:  # noqa: BLE001  (no preconditioner family in this version)
        return "jacobi"


def test_inverse_conductivity_3d_matrix_is_the_7_point_stencil(rng):
    # the vectorized pattern and values against a loop over cells (n = 4)
    ex = _load("inverse_conductivity_3d")
    n = 4
    problem = ex.Problem(n)
    m = 0.3 * rng.standard_normal(n ** 3)
    A = np.zeros((n ** 3, n ** 3))
    np.add.at(A, (problem.rows, problem.cols), ex.entries(problem, m, xp=np))
    k, idx, h2 = np.exp(m).reshape(n, n, n), np.arange(n ** 3).reshape(n, n, n), problem.h ** 2
    want = np.zeros_like(A)
    for i, j, l in np.ndindex(n, n, n):
        for d in np.vstack([np.eye(3, dtype=int), -np.eye(3, dtype=int)]):
            q = (i + d[0], j + d[1], l + d[2])
            if all(0 <= c < n for c in q):
                kf = 0.5 * (k[i, j, l] + k[q])
                want[idx[i, j, l], idx[i, j, l]] += kf / h2
                want[idx[i, j, l], idx[q]] -= kf / h2
            else:  # a boundary face: the node's own conductivity
                want[idx[i, j, l], idx[i, j, l]] += k[i, j, l] / h2
    assert len(set(zip(problem.rows.tolist(), problem.cols.tolist()))) == problem.rows.size
    np.testing.assert_allclose(A, want, rtol=1e-14, atol=0)


def test_inverse_conductivity_3d_taylor_and_misfit_falls(capsys):
    ex = _load("inverse_conductivity_3d")
    res, rates, history, m_true = ex.main(n=10, maxiter=8, plot=None,
                                          preconditioner=_krylov_preconditioner())
    assert np.all(np.abs(rates - 2.0) < 0.1), rates
    assert history[-1] < 0.5 * history[0], history
    assert np.linalg.norm(res.x - m_true) < 0.8 * np.linalg.norm(m_true)  # the start is 0
    out = capsys.readouterr().out
    assert "Taylor test" in out and "iter   1" in out and "done:" in out


@pytest.mark.slow
def test_inverse_conductivity_3d_recovers_the_field_at_24_cubed():
    ex = _load("inverse_conductivity_3d")
    res, rates, history, m_true = ex.main(n=24, maxiter=40, plot=None, verbose=False,
                                          preconditioner=_krylov_preconditioner())
    assert np.all(np.abs(rates - 2.0) < 0.1), rates
    # the misfit is in units of the 1% noise: it levels off near 0.5
    assert history[-1] < 0.5 * history[0] and history[-1] < 0.55, history
    assert np.linalg.norm(res.x - m_true) < 0.5 * np.linalg.norm(m_true)


def test_fem_impedance_tomography_taylor_and_recovery(capsys):
    ex = _load("fem_impedance_tomography")
    res, rates, history, m_true = ex.main(nrefs=3, maxiter=60, plot=None)
    assert np.all(np.abs(rates - 2.0) < 0.1), rates
    assert history[-1] < 0.2 * history[0]
    assert np.linalg.norm(res.x - m_true) < 0.8 * np.linalg.norm(m_true)
    out = capsys.readouterr().out
    assert "Taylor test" in out and "done:" in out


def test_fem_elasticity_identification_taylor_and_recovery(capsys):
    ex = _load("fem_elasticity_identification")
    res, rates, history, m_true = ex.main(nx=13, maxiter=30, plot=None)
    assert np.all(np.abs(rates - 2.0) < 0.1), rates
    assert history[-1] < 0.2 * history[0]
    assert np.linalg.norm(res.x - m_true) < 0.7 * np.linalg.norm(m_true)
    out = capsys.readouterr().out
    assert "Taylor test" in out and "done:" in out


def test_fem_elasticity_identification_one_factorization_for_both_load_cases():
    import sciad as sd

    ex = _load("fem_elasticity_identification")
    problem = ex.Problem(9)
    data, sigma = ex.make_data(problem)
    f = lambda m: ex.objective(m, data, sigma, problem)  # noqa: E731
    g = sd.graph.passes.optimize(sd.trace(sd.value_and_grad(f), np.zeros(problem.scalar.N)))
    factors = [n for n in g.nodes if "factor" in n.primitive.name]
    assert len(factors) == 1, g.pretty(source=False)


def test_fem_impedance_tomography_one_factorization_for_all_patterns():
    import sciad as sd

    ex = _load("fem_impedance_tomography")
    problem = ex.Problem(2, n_freq=3)
    data, sigma = ex.make_data(problem)
    f = lambda m: ex.objective(m, data, sigma, problem)  # noqa: E731
    g = sd.graph.passes.optimize(sd.trace(sd.value_and_grad(f), np.zeros(problem.basis.N)))
    factors = [n for n in g.nodes if "factor" in n.primitive.name]
    assert len(factors) == 1, g.pretty(source=False)


@pytest.mark.slow  # ~40 s: each eager solve_ivp with events compiles its own program
def test_solve_ivp_events_range_passes_the_taylor_test():
    """The projectile example's range (a terminal event's state inside
    `sd.grad`): its derivative passes the Taylor test and is the one its
    compiled value-and-gradient gives at a second angle."""
    import sciad as sd

    ex = _load("ode_solve_ivp_events")
    rates = sd.testing.taylor_test(ex.range_of, np.array(0.7), np.array(1.0))
    assert np.all(np.abs(rates - 2.0) < 0.1), rates
    vg = sd.function(sd.value_and_grad(ex.range_of))
    v, g = vg(np.array(0.6))
    eps = 1e-5
    fd = (float(vg(np.array(0.6 + eps))[0]) - float(vg(np.array(0.6 - eps))[0])) / (2 * eps)
    np.testing.assert_allclose(float(g), fd, rtol=1e-6)


def test_bayesian_poisson_pieces_agree_with_dense_linear_algebra():
    """Each piece of the Laplace workflow (log-determinants, the selected
    inverse, samples, the marginal likelihood, posterior variances at full
    rank) against NumPy with dense matrices on a small grid."""
    ex = _load("bayesian_poisson")
    checks = ex.dense_checks(6, say=lambda *a: None)
    assert set(checks) >= {"slogdet", "selected inverse", "samples' covariance",
                           "marginal likelihood", "posterior std (full rank)", "prior std"}
    for name, err in checks.items():
        assert err < 1e-10, (name, err)


# slow: its pieces are test_bayesian_poisson_pieces_agree_with_dense_linear_algebra's
@pytest.mark.slow
def test_bayesian_poisson_quantifies_the_uncertainty(capsys):
    ex = _load("bayesian_poisson")
    out = ex.main(n=12, rank=30, maxiter=150, checks=False)  # (checked above)
    assert np.all(np.abs(out["evidence_rates"] - 2.0) < 0.1), out["evidence_rates"]
    assert np.all(np.abs(out["rates"] - 2.0) < 0.1), out["rates"]
    # the data shrink the prior's variance everywhere, and the MAP point's
    # error is mostly within two posterior standard deviations
    assert np.all(out["std"] < out["prior_std"])
    assert out["inside"] > 0.8
    assert np.linalg.norm(out["m_map"] - out["m_true"]) < 0.8 * np.linalg.norm(out["m_true"])
    assert np.all(np.diff(out["lam"]) <= 1e-9 * out["lam"][0])  # sorted, largest first
    assert np.isfinite(out["draws"]).all()
    text = capsys.readouterr().out
    assert "marginal likelihood: Taylor test" in text and "Laplace:" in text


def test_without_matplotlib_an_example_says_no_figure_and_writes_none(monkeypatch, capsys):
    """Every example's `_plot` returns False without matplotlib (after saying
    how to get it), and its `main` says "figure written" only after a
    `_plot` that returned True (it said both before)."""
    import ast
    import inspect
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # (its import raises ImportError)
    names = sorted(n[:-3] for n in os.listdir(EXAMPLES) if n.endswith(".py"))
    plotting = 0
    for name in names:
        with open(os.path.join(EXAMPLES, name + ".py")) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):  # every "figure written" is said right under `if _plot(...)`
            body = getattr(node, "body", [])
            for stmt in body if isinstance(body, list) else []:
                if isinstance(stmt, ast.Expr) and "figure written" in ast.unparse(stmt):
                    assert isinstance(node, ast.If) and ast.unparse(node.test).startswith(
                        "_plot("), (name, ast.unparse(node))
        if not any(isinstance(n, ast.FunctionDef) and n.name == "_plot" for n in tree.body):
            continue
        plotting += 1
        plot = _load(name)._plot
        args = [None] * len(inspect.signature(plot).parameters)
        assert plot(*args) is False, name
        assert "matplotlib is not installed" in capsys.readouterr().out, name
    assert plotting >= 13


def test_topology_optimization_2d_lowers_the_compliance_at_the_volume(capsys):
    ex = _load("topology_optimization")
    out = ex.main(["--dim", "2", "--nx", "30", "--ny", "10", "--iters", "10"])["2d"]
    assert np.all(np.abs(out["rates"] - 2.0) < 0.1), out["rates"]
    history = out["history"]
    assert len(history) == 11 and history[-1] < 0.5 * history[0], history
    assert abs(out["volume"] - 0.5) < 2e-3, out["volume"]
    assert np.all((out["x"] >= 0.0) & (out["x"] <= 1.0))
    text = capsys.readouterr().out
    assert "Taylor test" in text and "iter  10" in text and "done: 10 OC iterations" in text


def test_topology_optimization_3d_amg_cg_lowers_the_compliance_at_the_volume(capsys):
    ex = _load("topology_optimization")
    out = ex.main(["--dim", "3", "--nx", "8", "--ny", "4", "--nz", "4", "--iters", "2"])["3d"]
    assert np.all(np.abs(out["rates"] - 2.0) < 0.1), out["rates"]
    history = out["history"]
    assert len(history) == 3 and history[-1] < history[1] < history[0], history
    assert abs(out["volume"] - 0.12) < 2e-3, out["volume"]
    assert "CG + AMG" in capsys.readouterr().out


def test_topology_optimization_element_matrices_and_bad_options():
    ex = _load("topology_optimization")
    # the 88-line code's plane-stress element matrix (in its own node
    # order): the same spectrum; in 3-D, six rigid-body modes
    nu = 0.3
    A11 = np.array([[12, 3, -6, -3], [3, 12, 3, 0], [-6, 3, 12, -3], [-3, 0, -3, 12]])
    A12 = np.array([[-6, -3, 0, 3], [-3, -6, -3, -6], [0, -3, -6, 3], [3, -6, 3, -6]])
    B11 = np.array([[-4, 3, -2, 9], [3, -4, -9, 4], [-2, -9, -4, -3], [9, 4, -3, -4]])
    B12 = np.array([[2, -3, 4, -9], [-3, 2, 9, -2], [4, 9, 2, 3], [-9, -2, 3, 2]])
    KE88 = (np.block([[A11, A12], [A12.T, A11]])
            + nu * np.block([[B11, B12], [B12.T, B11]])) / (24 * (1 - nu ** 2))
    np.testing.assert_allclose(np.linalg.eigvalsh(ex.element_stiffness(2)),
                               np.linalg.eigvalsh(KE88), atol=1e-14)
    w = np.linalg.eigvalsh(ex.element_stiffness(3))
    assert np.all(np.abs(w[:6]) < 1e-12) and w[6] > 1e-2
    for argv in (["--dim", "4"], ["--nx", "1"], ["--iters", "0"]):
        with pytest.raises(SystemExit):
            ex.parse_args(argv)
