"""Numerical honesty of the linear solves: a failing solve is loud, a
derivative never comes from a failed solve, `sd.to_jax` carries sciad's
derivatives through every solver, factorizations are values (per call,
released after their last use), and every sciad error arrives as a sciad
exception, whichever way the program was called."""

from __future__ import annotations

import subprocess
import sys
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg as sla
import scipy.sparse as sp
import scipy.sparse.linalg  # noqa: F401  (sp.linalg)

import sciad as sd
import sciad.numpy as snp
from sciad.errors import (ConvergenceError, DTypeError, IllConditionedWarning, NotSupportedError,
                          ShapeError, SingularMatrixError, StructureError)
from sciad.solvers.direct import _sparse_direct as sparse_direct


def _neumann(rng, n):
    """A 1-D Laplacian with random coefficients and Neumann ends: every row
    sums to zero (to rounding), so it is singular, with no exactly zero pivot."""
    k = rng.uniform(0.5, 2.0, n + 1)
    main = np.zeros(n)
    main[:-1] += k[1:-1]
    main[1:] += k[1:-1]
    M = sp.diags([-k[1:-1], main, -k[1:-1]], [-1, 0, 1], format="csr")
    M.sort_indices()
    return M


def _csr(M, tags=()):
    return lambda d: sd.sparse.csr_matrix((d, M.indices, M.indptr), shape=M.shape, tags=tags)


def _poisson(n):
    """The 1-D Dirichlet Laplacian, spd, as CSR."""
    M = sp.diags([-np.ones(n - 1), 2 * np.ones(n), -np.ones(n - 1)], [-1, 0, 1], format="csr")
    M.sort_indices()
    return M


# ---------------------------------------------------------------------------
# 0. sd.to_jax: sciad's derivatives through direct solves (registry-wide in
#    test_to_jax.py); here the flagship-like cases that were wrong


@pytest.mark.parametrize("solver", [pytest.param("lu", marks=pytest.mark.slow), "splu", "klu",
                                    pytest.param("spsolve", marks=pytest.mark.slow)])
def test_to_jax_gradients_through_solves(rng, solver):
    n = 6
    sparse = solver in ("splu", "klu", "spsolve")
    M = _poisson(n)
    b = rng.standard_normal(n)

    def loss(p, b):
        if sparse:
            A = _csr(M)(M.data * snp.exp(p[0]))
        else:
            A = snp.asarray(M.toarray()) * snp.exp(p[0]) + snp.eye(n) * p
        x = sd.linalg.solve(A, b, solver=solver)
        return snp.sum(snp.sin(x) * b)

    p = 0.1 * rng.standard_normal(n)
    F = sd.to_jax(loss)
    want_p, want_b = sd.grad(loss, argnums=(0, 1))(p, b)
    got_p, got_b = jax.grad(F, argnums=(0, 1))(p, b)  # was 0 (matrix) or a TypeError (rhs)
    np.testing.assert_allclose(got_p, want_p, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got_b, want_b, rtol=1e-9, atol=1e-12)
    tp = rng.standard_normal(n)
    _, jv = jax.jvp(F, (p, b), (tp, np.zeros(n)))
    np.testing.assert_allclose(jv, np.dot(want_p, tp), rtol=1e-8)
    if solver in ("lu", "splu"):  # second order: forward over reverse, sciad's rules
        _, hv = jax.jvp(jax.grad(F), (p, b), (tp, np.zeros(n)))
        np.testing.assert_allclose(hv, sd.hvp(lambda p: loss(p, b), p, tp), rtol=1e-8,
                                   atol=1e-12)
    if solver == "spsolve":
        return  # (JAX's spsolve has no batching rule yet: vmap raises JAX's error)
    ps = np.stack([p, 2 * p])  # vmap of grad: was all zeros
    got = jax.jit(jax.vmap(jax.grad(F), (0, None)))(ps, b)
    np.testing.assert_allclose(got[1], sd.grad(loss)(2 * p, b), rtol=1e-9, atol=1e-12)


def test_flagship_objective_moves_under_a_jax_optimizer():
    """Adam through `sd.to_jax` on the flagship's objective: the gradient is
    sciad's (it was 1.4e-2 against 1.98), and the objective decreases."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples",
                        "inverse_poisson.py")
    spec = importlib.util.spec_from_file_location("inverse_poisson", path)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    problem = ex.Problem(12)
    data, sigma = ex.make_data(problem)
    m0 = np.zeros(problem.n * problem.n)
    F = sd.to_jax(lambda m: ex.objective(m, data, sigma, problem))
    g_sd = sd.grad(lambda m: ex.objective(m, data, sigma, problem))(m0)
    g_jax = jax.grad(F)(m0)
    np.testing.assert_allclose(g_jax, g_sd, rtol=1e-9, atol=1e-12 * np.abs(g_sd).max())
    import optax
    opt = optax.adam(0.1)

    @jax.jit
    def step(m, state):
        v, g = jax.value_and_grad(F)(m)
        updates, state = opt.update(g, state, m)
        return optax.apply_updates(m, updates), state, v

    m, state, values = jnp.asarray(m0), opt.init(jnp.asarray(m0)), []
    for _ in range(8):
        m, state, v = step(m, state)
        values.append(float(v))
    assert values[-1] < 0.9 * values[0], values


# ---------------------------------------------------------------------------
# 1. numerically singular systems raise (and so do their gradients)


@pytest.mark.parametrize("solver", ["splu", "klu", "spsolve", "lu"])
def test_numerically_singular_system_raises(rng, solver):
    n = 40
    M = _neumann(rng, n)
    b = rng.standard_normal(n)
    if solver == "lu":
        f = sd.function(lambda A, b: sd.linalg.solve(A, b, solver="lu"))
        args = (M.toarray(), b)
    else:
        f = sd.function(lambda d, b: sd.linalg.solve(_csr(M)(d), b, solver=solver))
        args = (M.data, b)
    with pytest.raises(SingularMatrixError, match="singular") as info:
        f(*args)
    assert "test_numerical_honesty.py" in str(info.value)
    if solver != "lu":  # the message gives the condition estimate and the residual
        assert "singular to working precision" in str(info.value)
        assert info.value.rcond < np.finfo(float).eps
        g = sd.function(sd.grad(lambda d: snp.sum(
            sd.linalg.solve(_csr(M)(d), b, solver=solver) ** 2)))
        with pytest.raises(SingularMatrixError):
            g(M.data)
    # throw=False reports it instead
    x, info = sd.function(lambda d, b: sd.linalg.solve(_csr(M)(d), b, throw=False))(M.data, b)
    assert not bool(info.converged) and float(info.rcond) < 1e-15


# ---------------------------------------------------------------------------
# 3. ill-conditioning warns, with the condition estimate


def test_hilbert_warns_and_reports_rcond():
    H = sla.hilbert(14)
    b = H @ np.ones(14)
    f = sd.function(lambda A, b: sd.linalg.solve(A, b))
    # (the estimate of a condition number near 1e18 varies with the LAPACK build)
    with pytest.warns(IllConditionedWarning, match=r"condition number about \de\+1[78] "
                                                   r"exceeds 1/eps"):
        f(H, b)
    x, info = sd.function(lambda A, b: sd.linalg.solve(A, b, throw=False))(H, b)
    np.testing.assert_allclose(float(info.rcond), 1 / np.linalg.cond(H, 1), rtol=0.5)
    assert float(info.backward_error) < 1e-15 and float(info.residual) < 1e-14
    with warnings.catch_warnings():  # a well-conditioned system does not warn
        warnings.simplefilter("error")
        f(H[:4, :4], b[:4])


def test_float32_ill_conditioning_warns(rng):
    Q, _ = np.linalg.qr(rng.standard_normal((8, 8)))
    A = (Q * np.logspace(0, -8, 8)) @ Q.T  # cond 1e8 > 1/eps(float32) = 8e6
    b = A @ np.ones(8)
    f = sd.function(lambda A, b: sd.linalg.solve(A, b))
    with pytest.warns(IllConditionedWarning, match="float32"):
        x = f(A.astype(np.float32), b.astype(np.float32))
    assert x.dtype == np.float32


def test_sparse_ill_conditioning_warns_with_checks_on():
    """A consistent sparse system with cond > 1/eps: its residual is small,
    so only the condition estimate (an expensive check for sparse matrices:
    a few extra solves) reveals it."""
    n = 12
    D = sp.diags(np.logspace(0, -17, n), format="csr")
    D.sort_indices()
    b = D @ np.ones(n)
    f = sd.function(lambda d, b: sd.linalg.solve(_csr(D)(d), b))
    with sd.config.checks(False), warnings.catch_warnings():
        warnings.simplefilter("error")
        f(D.data, b)
    with sd.config.checks(True):  # the setting is part of the compile cache key
        with pytest.warns(IllConditionedWarning):
            f(D.data, b)
    assert f.trace_count == 2


def test_cond_matches_numpy(rng):
    A = rng.standard_normal((6, 6)) + 2 * np.eye(6)
    M = sp.csr_matrix(A * (rng.random((6, 6)) < 0.6) + 4 * np.eye(6))
    M.sort_indices()
    f = sd.function(lambda A: [sd.linalg.cond(A), sd.linalg.cond(A, np.inf),
                               sd.linalg.cond(A, 2, estimate=False),
                               sd.linalg.cond(A, "fro", estimate=False),
                               sd.linalg.cond(A, 1, estimate=False)])
    est1, estinf, c2, cfro, c1 = f(A)
    for est, p in ((est1, 1), (estinf, np.inf)):  # a lower estimate, usually within 3x
        assert np.linalg.cond(A, p) / 3 <= float(est) <= np.linalg.cond(A, p) * (1 + 1e-12)
    np.testing.assert_allclose([c2, cfro, c1], [np.linalg.cond(A, p) for p in (2, "fro", 1)],
                               rtol=1e-10)
    cs = sd.function(lambda d: sd.linalg.cond(_csr(M)(d)))(M.data)
    assert np.linalg.cond(M.toarray(), 1) / 3 <= float(cs) <= np.linalg.cond(M.toarray(), 1) * 1.01
    assert float(sd.function(sd.linalg.cond)(np.ones((2, 2)))) == np.inf
    with pytest.raises(NotSupportedError, match="not differentiated"):
        sd.grad(lambda A: sd.linalg.cond(A))(A)
    g = sd.grad(lambda A: snp.sum(A) * sd.linalg.cond(A, constant=True))(A)  # a diagnostic
    np.testing.assert_allclose(np.asarray(g), np.full((6, 6), float(est1)), rtol=1e-12)
    with pytest.raises(NotSupportedError, match="sparse"):
        sd.trace(lambda d: sd.linalg.cond(_csr(M)(d), estimate=False), M.data)


def test_backward_error_check_and_refinement(rng):
    """A SuperLU factor reused for a slightly different matrix (a Newton-chord
    step, the last Newton factorization reused at a root, a factorization
    kept across time steps): the solve's backward error is above the bound,
    and steps of iterative refinement with the true matrix restore it.
    Beyond what refinement can fix, the solve factors the matrix it reads
    (the kept factor is a cache, which never changes a result). A dense
    Cholesky solve whose matrix is not the symmetric one it reads (within the
    symmetry tag's tolerance) raises with the backward error."""
    from sciad.primitives._linalg import linalg_backsolve_p, linalg_factor_p

    n = 30
    M = _poisson(n)
    p = sd.graph.Pattern(M.shape, M.indptr, M.indices)
    b = rng.standard_normal(n)

    def reuse(d_factored, d):
        A0, A = _csr(M)(d_factored), _csr(M)(d)
        F = linalg_factor_p.bind(A0, solver="splu", pattern=p)
        return linalg_backsolve_p.bind(F, A, b, solver="splu", pattern=p)

    f = sd.function(reuse)
    d = M.data * (1 + 1e-9 * rng.standard_normal(M.nnz))
    np.testing.assert_allclose(np.asarray(f(M.data, d)), sp.linalg.spsolve(
        sp.csr_matrix((d, M.indices, M.indptr), shape=M.shape), b), rtol=1e-12)
    d = M.data * (1 + 0.3 * rng.standard_normal(M.nnz))
    np.testing.assert_allclose(np.asarray(f(M.data, d)), sp.linalg.spsolve(
        sp.csr_matrix((d, M.indices, M.indptr), shape=M.shape), b), rtol=1e-10)
    B = rng.standard_normal((8, 8))
    S = B @ B.T + 8 * np.eye(8)
    A = S + 1e-10 * np.abs(S).max() * np.triu(rng.standard_normal((8, 8)), 1)
    with pytest.raises(SingularMatrixError, match="backward error"):
        sd.function(lambda A, b: sd.linalg.solve(A, b, assume="spd"))(A, b[:8])


# ---------------------------------------------------------------------------
# 5. every sciad error is a sciad exception: eager, sd.function, sd.to_jax


def test_eager_solve_raises_sciad_errors():
    with pytest.raises(SingularMatrixError, match="singular") as info:
        sd.linalg.solve(np.ones((2, 2)), np.ones(2))
    assert "test_numerical_honesty.py" in str(info.value)
    with pytest.raises(StructureError):
        sd.linalg.solve(np.array([[2.0, 1.0], [0.0, 2.0]]), np.ones(2), assume="symmetric")
    x = sd.linalg.solve(np.array([[2.0, 1.0], [1.0, 2.0]]), np.ones(2))
    np.testing.assert_allclose(np.asarray(x), [1 / 3, 1 / 3])


def test_to_jax_raises_sciad_errors():
    F = sd.to_jax(lambda A, b: sd.linalg.solve(A, b))
    A, b = np.ones((2, 2)), np.ones(2)
    with pytest.raises(SingularMatrixError):
        F(A, b)
    with pytest.raises(SingularMatrixError):
        jax.grad(lambda A: jnp.sum(F(A, b)))(A)
    step = jax.jit(lambda A: jnp.sum(F(A, b)))
    with pytest.raises(jax.errors.JaxRuntimeError, match="SingularMatrixError"):
        step(A).block_until_ready()  # JAX's own dispatch: its error carries sciad's
    with pytest.raises(SingularMatrixError):
        with sd.errors.unwrapped():
            step(A).block_until_ready()


# ---------------------------------------------------------------------------
# 6. factorizations are values: concurrent calls, nothing held between calls


def test_concurrent_calls_of_one_compiled_sparse_solve(rng):
    n = 30
    M = _poisson(n)
    f = sd.function(sd.value_and_grad(
        lambda d, b: snp.sum(sd.linalg.solve(_csr(M, ("spd",))(d), b) ** 2)))
    bs = [rng.standard_normal(n) for _ in range(8)]
    scales = [1.0 + i for i in range(8)]
    held = sparse_direct.held()  # (factors saved by sd.to_jax in other tests)
    want = [f(M.data * s, b) for s, b in zip(scales, bs)]
    got, errors = [None] * 8, []

    def run(i):
        try:
            for _ in range(5):
                got[i] = f(M.data * scales[i], bs[i])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g[1]), np.asarray(w[1]), rtol=1e-12)
    assert sparse_direct.held() == held  # every factor released by its last solve


def test_factors_are_released_after_their_last_use(rng):
    n = 20
    M = _poisson(n)
    b = rng.standard_normal(n)
    vg = sd.function(sd.value_and_grad(lambda d: snp.sum(sd.linalg.solve(_csr(M)(d), b) ** 2)))
    held = sparse_direct.held()  # (factors saved by sd.to_jax in other tests)
    for _ in range(3):
        vg(M.data)
        assert sparse_direct.held() == held
    g = sd.graph.passes.optimize(sd.trace(sd.value_and_grad(
        lambda d: snp.sum(sd.linalg.solve(_csr(M)(d), b) ** 2)), M.data))
    (factor,) = [nd for nd in g.nodes if nd.primitive.name == "linalg.factor"]
    assert factor.params["uses"] == 2 and "uses=2" in str(factor)
    # a factor saved for a later backward pass (sd.to_jax) is kept, within a bound
    F = sd.to_jax(lambda d: snp.sum(sd.linalg.solve(_csr(M)(d), b) ** 2))
    for k in range(sparse_direct.MAX_KEPT + 4):
        jax.grad(F)(M.data * (1 + k))
    assert sparse_direct.held() <= held + sparse_direct.MAX_KEPT


# ---------------------------------------------------------------------------
# 10. float64 results stay float64 outside sciad


def test_float64_results_stay_float64_after_import():
    import os

    if "JAX_ENABLE_X64" not in os.environ and "SCIAD_ENABLE_X64" not in os.environ:
        assert jax.config.jax_enable_x64 and sd.config.x64_policy.startswith("on")
    a = sd.function(lambda x: x * 1.0)(np.arange(3.0))
    b = a * 2.0 - np.ones(3)  # the user's own code on a result
    assert a.dtype == np.float64 and b.dtype == np.float64
    # an explicit choice in the environment is kept, and sciad still computes in float64
    out = _printed("import numpy as np, jax, sciad as sd\n"
                   "a = sd.function(lambda x: x * 1.0)(np.arange(3.0))\n"
                   "print(jax.config.jax_enable_x64, a.dtype)\n", SCIAD_ENABLE_X64="0")
    assert out == ["False", "float64"], out


def test_large_constants_are_executable_arguments_not_program_text(rng):
    # a program holding a 200,000-entry index map (a mesh's) lowers to a
    # short text: the map is one argument the executable reads (JAX's
    # hoisting, which importing sciad turns on), shared by its two readers
    import os

    if not any(k in os.environ for k in ("JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS",
                                         "SCIAD_HOIST_CONSTANTS")):
        assert sd.config.constants_policy.startswith("on")
        assert jax.config.jax_use_simplified_jaxpr_constants
    n, m = 1000, 200_000
    index = rng.integers(0, n, m)
    weights = rng.standard_normal(m)

    def f(x):
        y = x[index] * weights
        return snp.sum(y * x[index])

    fn = sd.function(f)
    x = rng.standard_normal(n)
    text = fn.lower(x).as_text()
    assert len(text) < 100_000, len(text)  # (the map alone: 3.2 MB of text)
    assert text.count("jax.const = true") == 2  # index and weights, each once
    np.testing.assert_allclose(float(fn(x)), np.sum(x[index] ** 2 * weights), rtol=1e-12)
    # with the environment's choice, JAX's setting is kept
    out = _printed("import jax, sciad as sd\n"
                   "print(jax.config.jax_use_simplified_jaxpr_constants, "
                   "sd.config.constants_policy.split(':')[0])\n", SCIAD_HOIST_CONSTANTS="0")
    assert out == ["False", "kept"], out


def test_small_loops_policy_asks_xla_once_and_keeps_your_choice(monkeypatch):
    """Importing sciad asks XLA (`XLA_FLAGS`, read when its backend starts)
    to compile a loop touching under 64 KiB a pass as one function; your
    `xla_backend_extra_options`, or `SCIAD_SMALL_LOOP_BYTES`, wins; a
    backend already started cannot take it, and the policy says what to do.
    (`_choose_loops` run again here, the environment restored after.)"""
    import os

    from jax._src import xla_bridge

    from sciad import _startup

    ours = "--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=65536"
    if "SCIAD_SMALL_LOOP_BYTES" not in os.environ and "xla_backend_extra_options" not in \
            os.environ.get("XLA_FLAGS", "").replace(ours, ""):
        assert sd.config.loops_policy.startswith("on"), sd.config.loops_policy
        assert ours in os.environ["XLA_FLAGS"].split()
    flags = "--xla_force_host_platform_device_count=2"
    monkeypatch.delenv("SCIAD_SMALL_LOOP_BYTES", raising=False)
    monkeypatch.setenv("XLA_FLAGS", flags)
    monkeypatch.setattr(xla_bridge, "backends_are_initialized", lambda: False)
    assert _startup._choose_loops().startswith("on: loops touching under 65536 bytes")
    assert os.environ["XLA_FLAGS"] == flags + " " + ours
    assert _startup._choose_loops().endswith("(XLA_FLAGS holds it already)")  # (a child's)
    assert os.environ["XLA_FLAGS"] == flags + " " + ours
    # your own backend options: left as they are
    mine = "--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=10"
    monkeypatch.setenv("XLA_FLAGS", mine)
    assert _startup._choose_loops().startswith("kept: XLA_FLAGS")
    assert os.environ["XLA_FLAGS"] == mine
    # a size of your own, or none (0)
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.setenv("SCIAD_SMALL_LOOP_BYTES", "4096")
    assert _startup._choose_loops().startswith("on: loops touching under 4096 bytes")
    assert os.environ["XLA_FLAGS"].endswith("threshold=4096")
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.setenv("SCIAD_SMALL_LOOP_BYTES", "0")
    assert _startup._choose_loops().startswith("kept: SCIAD_SMALL_LOOP_BYTES=0")
    monkeypatch.setenv("SCIAD_SMALL_LOOP_BYTES", " ")  # (set but empty: as unset)
    assert _startup._choose_loops().startswith("on: loops touching under 65536 bytes")
    monkeypatch.setenv("XLA_FLAGS", "")
    for bad in ("64k", "-1"):
        monkeypatch.setenv("SCIAD_SMALL_LOOP_BYTES", bad)
        assert "is not a number of bytes" in _startup._choose_loops()
    assert os.environ["XLA_FLAGS"] == ""
    # JAX's backend started first: too late, and said so with the flag to set
    monkeypatch.delenv("SCIAD_SMALL_LOOP_BYTES")
    monkeypatch.setattr(xla_bridge, "backends_are_initialized", lambda: True)
    policy = _startup._choose_loops()
    assert policy.startswith("off: JAX's backend started before sciad") and \
        "threshold=65536" in policy
    assert os.environ["XLA_FLAGS"] == ""


@pytest.mark.slow  # ~7 s: a child process importing JAX first
def test_a_large_embedded_index_array_warns_once_where_jax_came_first():
    """`ConstantsWarning` (once per process) where JAX was imported before
    sciad and a program would embed an index array of 32 MiB or more; none
    where sciad came first (hoisted), for a smaller array, or where the
    user chose the switch."""
    code = ("{first}\n"
            "import warnings, numpy as np\n"
            "from sciad.solvers import _indices\n"
            "warnings.simplefilter('always')\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    _indices.index_array(np.arange(1000))\n"
            "    _indices.index_array(np.arange(9_000_000))\n"
            "    _indices.index_array(np.arange(9_000_001))\n"
            "print(len(w), (w[0].category.__name__ if w else '-'))\n")
    assert _printed(code.format(first="import jax, sciad")) == ["1", "ConstantsWarning"]
    assert _printed(code.format(first="import sciad, jax")) == ["0", "-"]
    assert _printed(code.format(first="import jax, sciad"),
                    SCIAD_HOIST_CONSTANTS="0") == ["0", "-"]


def _printed(code: str, **env) -> list[str]:
    """The words `code` prints in a fresh interpreter with `env` set (and
    sciad's and JAX's switches otherwise unset)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_env(**env), check=True).stdout.split()


def _env(**extra):
    import os

    env = {k: v for k, v in os.environ.items()
           if k not in ("SCIAD_ENABLE_X64", "JAX_ENABLE_X64", "SCIAD_HOIST_CONSTANTS",
                        "JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS")}
    env.update(extra)
    return env


# ---------------------------------------------------------------------------
# 11. the smaller items


def test_convergence_error_reports_float64_values(rng):
    M = _poisson(40)
    b = rng.standard_normal(40)
    f = sd.function(lambda d, b: sd.linalg.solve(_csr(M)(d), b, solver="cg", maxiter=3,
                                                 tol=1e-10))
    with pytest.raises(ConvergenceError) as info:
        f(M.data, b)
    _, status = sd.function(lambda d, b: sd.linalg.solve(_csr(M)(d), b, solver="cg",
                                                         maxiter=3, tol=1e-10,
                                                         throw=False))(M.data, b)
    assert info.value.tolerance == 1e-10  # not 1.0000000133514320e-10 (float32)
    np.testing.assert_allclose(info.value.residual, float(status.residual), rtol=1e-9)
    assert info.value.iterations == 3


def test_complex_with_cg_names_the_types():
    with pytest.raises(DTypeError, match=r"real matrices, got c128\[3,3\]"):
        sd.trace(lambda A, b: sd.linalg.solve(A, b, solver="cg"), np.eye(3, dtype=complex),
                 np.ones(3, complex))


def test_evaluate_checks_argument_types():
    g = sd.trace(lambda A, b: sd.linalg.solve(A, b), np.eye(3), np.ones(3))
    with pytest.raises(DTypeError, match=r"input 0 \(A\) is f64\[3,3\], got dtype float32"):
        sd.graph.evaluate(g, np.eye(3, dtype=np.float32), np.ones(3))
    with pytest.raises(ShapeError, match="got an array of shape"):
        sd.graph.evaluate(g, np.eye(4), np.ones(3))
    np.testing.assert_allclose(np.asarray(sd.graph.evaluate(g, 2 * np.eye(3), np.ones(3))[0]),
                               0.5 * np.ones(3))
