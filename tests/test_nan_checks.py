"""NaN is a failure: every numerical check in sciad reads a NaN measure as
failing (`if not x <= tol: fail`), never as passing (`if x > tol: fail`).

Each check has a test here that feeds NaN to its measure, directly (the
host-side judge, on a `Site`) or through an input that produces it, and
asserts the sciad error it must raise."""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

import sciad as sd
import sciad.numpy as snp
from sciad.errors import (ConvergenceError, NonFiniteError, NotPositiveDefiniteError, RuleError,
                          SingularMatrixError, StructureError, runtime_error_from)
from sciad.graph import Site
from sciad.primitives import _checks, _eigen, _svd
from sciad.primitives._linalg import judge_krylov
from sciad.solvers.direct import _sparse_direct as sparse_direct
from sciad.solvers._measures import ratio

NAN = float("nan")


def judged(judge, **measures):
    """The sciad error `judge` raises on `measures` (None if it passes)."""
    try:
        judge(Site("test.op"), **measures)
    except RuntimeError as e:  # (a run-time check's error, as it leaves XLA)
        return runtime_error_from(e)
    return None


# ---------------------------------------------------------------------------
# direct solves: the singular systems of the issue, and the measures


def _neumann(n=40):
    """The 1-D Neumann Laplacian: rows sum to zero exactly, SuperLU meets an
    exactly zero pivot (`spsolve` returned NaN, with only SciPy's warning)."""
    M = sp.diags([-np.ones(n - 1), 2.0 * np.ones(n), -np.ones(n - 1)], [-1, 0, 1]).tolil()
    M[0, 0] = M[n - 1, n - 1] = 1.0
    return M.tocsr()


SINGULAR = {
    "neumann": _neumann(),
    "rank1": sp.csr_matrix(np.outer(np.arange(1.0, 5.0), np.arange(1.0, 5.0))),
    "zero": sp.csr_matrix((np.zeros(4), np.arange(4), np.arange(5)), shape=(4, 4)),  # stored
}


def _solve_sum(M, solver):
    """`d, b -> sum(solve(A(d), b))` for the matrix `M`'s pattern (sparse
    solvers) or for dense `A` (`d` the dense matrix)."""
    if solver in ("lu", "cholesky"):
        return lambda d, b: snp.sum(sd.linalg.solve(d, b, solver=solver))
    M = sp.csr_matrix(M)
    M.sort_indices()

    def f(d, b):
        A = sd.sparse.csr_matrix((d, M.indices, M.indptr), shape=M.shape)
        return snp.sum(sd.linalg.solve(A, b, solver=solver))

    return f


def _operands(M, solver):
    M = sp.csr_matrix(M)
    M.sort_indices()
    b = np.linspace(1.0, 2.0, M.shape[0])  # not in the range of any of them
    return (M.toarray() if solver in ("lu", "cholesky") else M.data), b


def _raises_for_each_mode(M, solver, error, match=None):
    f = _solve_sum(M, solver)
    d, b = _operands(M, solver)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (SciPy's MatrixRankWarning, from JAX's spsolve)
        with pytest.raises(error, match=match):
            sd.function(f)(d, b)
        with pytest.raises(error, match=match):
            sd.grad(f, argnums=(0, 1))(d, b)


@pytest.mark.parametrize("case", sorted(SINGULAR))
def test_spsolve_of_a_singular_matrix_raises_instead_of_nan(case):
    """`spsolve` returns NaN for these; the backward error of a NaN solution
    read 0 (`where(rn > 0, inf, 0)` is 0 for NaN), so with checks off (the
    condition estimate then runs only where a measure is off) NaN came out,
    forward and as the gradient."""
    with sd.config.checks(False):
        _raises_for_each_mode(SINGULAR[case], "spsolve", SingularMatrixError,
                              match="the solve returned NaN or infinite values")


@pytest.mark.slow
@pytest.mark.parametrize("checks", [False, True])
@pytest.mark.parametrize("solver, error", [
    ("spsolve", SingularMatrixError), ("splu", SingularMatrixError),
    ("klu", SingularMatrixError), ("lu", SingularMatrixError),
    ("cholesky", NotPositiveDefiniteError),
    ("cg", ConvergenceError), ("gmres", ConvergenceError), ("bicgstab", ConvergenceError)])
@pytest.mark.parametrize("case", sorted(SINGULAR))
def test_every_solver_raises_on_the_singular_systems(case, solver, error, checks):
    with sd.config.checks(checks):
        _raises_for_each_mode(SINGULAR[case], solver, error)


def test_a_nan_solution_fails_judge_solve():
    for measures in (dict(backward_error=NAN), dict(residual=NAN),
                     dict(backward_error=NAN, residual=NAN, rcond=0.0)):
        err = judged(_checks.judge_solve, dtype=np.float64, n=4, **measures)
        assert isinstance(err, SingularMatrixError), measures
        assert "returned NaN or infinite values" in str(err)
    assert judged(_checks.judge_solve, dtype=np.float64, n=4) is None  # (the measures pass)


def test_a_nan_matrix_measure_fails_judge_matrix():
    err = judged(_checks.judge_matrix, dtype=np.float64, tags={"symmetric"}, asymmetry=NAN)
    assert isinstance(err, StructureError) and "not symmetric" in str(err)
    err = judged(_checks.judge_matrix, dtype=np.float64, tags={"spd"}, min_diagonal=NAN)
    assert isinstance(err, StructureError) and "diagonal" in str(err)


def test_the_measures_of_a_nan_solution_are_nan():
    """The solve's measures, on the host (SuperLU, several right-hand sides)
    and the guarded division they share: NaN stays NaN."""
    np.testing.assert_array_equal(ratio(np.array([1.0, 0.0, 1.0, NAN, 0.0]),
                                        np.array([2.0, 0.0, 0.0, 0.0, NAN])),
                                  [0.5, 0.0, np.inf, NAN, NAN])
    x = np.full((3, 2), NAN)
    r, b = np.full((3, 2), NAN), np.ones((3, 2))
    eta, rel = sparse_direct.measures(r, x, b, 0.0)  # (a zero matrix: no `den > 0`)
    assert np.isnan(eta) and np.isnan(rel)
    eta, rel = sparse_direct.measures(r[:, 0], x[:, 0], b[:, 0], 0.0)
    assert np.isnan(eta) and np.isnan(rel)


def test_throw_false_reports_the_nan_backward_error():
    M = SINGULAR["zero"]
    A = sd.sparse.csr_matrix((M.data, M.indices, M.indptr), shape=M.shape)
    with sd.config.checks(False), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x, info = sd.linalg.solve(A, np.ones(4), solver="spsolve", throw=False)
    assert np.isnan(np.asarray(x)).all()
    assert not bool(info.converged) and np.isnan(float(info.backward_error))  # (was 0)
    assert np.isnan(float(info.residual))


def test_a_nan_inverse_norm_is_a_singular_condition_estimate():
    """SuperLU's condition estimate: an inverse norm of NaN (solves with the
    factor that overflowed) gave rcond = inf, a perfectly conditioned matrix."""
    class NanFactor:
        def solve(self, b, trans="N"):
            return np.full_like(b, NAN)

    for n in (3, 8):  # (exact inverse, and onenormest)
        M = sp.identity(n, format="csr")
        pattern = sd.graph.Pattern(M.shape, M.indptr, M.indices)
        assert sparse_direct._rcond_here(pattern, M.data, NanFactor(), 1.0) == 0.0
        assert sparse_direct._rcond_here(pattern, M.data, _superlu(M), 1.0) == 1.0


def _superlu(M):
    """A SuperLU factor as `sparse_direct` keeps it: of `A^T`."""
    return spla.splu(sp.csc_matrix(M.T), permc_spec="MMD_AT_PLUS_A")


# ---------------------------------------------------------------------------
# ODEs: the output times, the step control


def test_output_times_with_nan_are_refused_when_the_program_runs():
    """Concrete `ts` are checked at trace time; traced ones by the node. Its
    test was `any(diff(ts) <= 0)`, false for NaN (NaN inside `ts` passed,
    as a wrong diagnosis of the state; at an end, and any non-increasing
    `ts`, diffrax stopped with an error of its own, not a sciad error)."""
    f = sd.function(lambda ts: sd.ode.odeint(lambda t, y, a: -y, np.array([1.0]), ts))
    np.testing.assert_allclose(np.asarray(f(np.array([0.0, 0.5, 1.0])))[:, 0],
                               np.exp([0.0, -0.5, -1.0]), rtol=1e-5)
    for ts in ([0.0, NAN, 1.0], [NAN, 0.5, 1.0], [0.0, 0.5, NAN], [0.0, 1.0, 0.5]):
        with pytest.raises(sd.errors.InvalidOptionError, match="must be finite and strictly increasing"):
            f(np.array(ts))


# ---------------------------------------------------------------------------
# the guards of eigen- and singular value derivatives, and eigsh's results


def _nan_matrix():
    a = np.diag([1.0, 2.0, 3.0])
    a[0, 1] = a[1, 0] = NAN
    return a


def test_a_nan_eigendecomposition_fails_the_guard():
    """NaN eigenvalues were never judged (`|w_i - w_j| <= width` is false for
    NaN: no cluster, no host call), and the gradient came out NaN."""
    with pytest.raises(NonFiniteError, match="eigenvalues are NaN"):
        sd.grad(lambda a: snp.sum(sd.linalg.eigh(a)[1][:, 0] ** 2 * snp.arange(3.0)))(
            _nan_matrix())
    with pytest.raises(NonFiniteError, match="singular values are NaN"):
        sd.grad(lambda a: snp.sum(sd.linalg.svd(a, compute_uv=False)))(_nan_matrix())


def test_nan_cotangents_inside_a_cluster_fail_the_guards():
    """Inside a cluster the guard compares the cotangents' spread with a
    slack made from their size: NaN passed both (`nan > nan` is false)."""
    w, v = np.array([1.0, 2.0, 2.0, 3.0]), np.eye(4)
    common = dict(op="linalg.eigh", tol=1e-8, complex_=False, v=v, w=w)
    err = judged(_eigen._judge_gauge, values_used=True, vectors_used=False,
                 w_bar=np.array([1.0, NAN, 1.0, 1.0]), v_bar=np.zeros((4, 4)), **common)
    assert isinstance(err, NonFiniteError) and "cotangent" in str(err)
    v_bar = np.zeros((4, 4))
    v_bar[1, 2] = NAN
    err = judged(_eigen._judge_gauge, values_used=False, vectors_used=True,
                 w_bar=np.zeros(4), v_bar=v_bar, **common)
    assert isinstance(err, NonFiniteError)
    assert judged(_eigen._judge_gauge, values_used=True, vectors_used=False,  # (it passes)
                  w_bar=np.array([1.0, 1.0, 1.0, 0.0]), v_bar=np.zeros((4, 4)),
                  **common) is None
    err = judged(_svd._judge_gauge, tol=1e-8, complex_=False, s=np.array([3.0, 1.0, 1.0]),
                 s_bar=np.array([1.0, NAN, 1.0]))
    assert isinstance(err, NonFiniteError) and "cotangent" in str(err)
    err = judged(_eigen._judge_gauge, values_used=True, vectors_used=False,  # eigsh's next
                 w_bar=np.ones(4), v_bar=np.zeros((4, 4)), edge=np.array(NAN), **common)
    assert isinstance(err, NonFiniteError)


def test_a_nan_matrix_function_domain_is_non_finite_not_indefinite():
    err = judged(_eigen._judge_domain, fn="log", domain="positive definite",
                 smallest=np.array([NAN]))
    assert isinstance(err, NonFiniteError)
    err = judged(_eigen._judge_domain, fn="log", domain="positive definite",
                 smallest=np.array([-1.0]))
    assert isinstance(err, NotPositiveDefiniteError)


def _diagonal(values):
    n = len(values)
    return sd.sparse.csr_matrix((np.asarray(values, float), np.arange(n), np.arange(n + 1)),
                                shape=(n, n))


def test_eigsh_refuses_a_singular_shift_and_nan_eigenpairs(monkeypatch):
    A = _diagonal(np.arange(1.0, 31.0))
    with pytest.raises(SingularMatrixError, match="sigma=3.0 is an eigenvalue"):
        sd.linalg.eigsh(A, k=3, sigma=3.0)  # (was SciPy's RuntimeError inside JAX's)
    w, _ = sd.linalg.eigsh(A, k=3, sigma=3.0 + 3e-8)
    np.testing.assert_allclose(np.asarray(w), [2.0, 3.0, 4.0], rtol=1e-10)

    def nan_eigsh(a, k, **kw):
        return np.full(k, NAN), np.full((a.shape[0], k), NAN)

    monkeypatch.setattr(spla, "eigsh", nan_eigsh)
    with pytest.raises(ConvergenceError, match="NaN or infinite eigenpairs"):
        sd.linalg.eigsh(_diagonal(np.arange(1.0, 32.0)), k=3)


# ---------------------------------------------------------------------------
# sd.testing.check_rules


def test_check_rules_fails_on_nan(rng):
    """Its comparisons are `not err <= tol`; the batching check took the
    largest error with Python's `max`, which drops a NaN after the first
    output (`max(0.0, nan)` is 0.0)."""
    def sin_like(nan_in_batch=False, nan_in_jvp=False):
        p = sd.primitive(f"test_nan_checks.sin_{rng.integers(2**40)}")
        p.def_abstract_eval(lambda x: x)
        p.def_impl(jnp.sin)

        @p.def_jvp
        def _jvp(primals, tangents):
            (x,), (t,) = primals, tangents
            return p(x), t * snp.cos(x) * (NAN if nan_in_jvp else 1.0)

        @p.def_batch
        def _batch(args, dims):
            return p(args[0]) * (NAN if nan_in_batch else 1.0), dims[0]

        return p

    x = rng.standard_normal(3)
    ok = sin_like()
    sd.testing.check_rules(lambda x: [2.0 * x, ok(x)], x)  # (the checks pass)
    bad = sin_like(nan_in_batch=True)
    with pytest.raises(RuleError, match=r"batching: .* relative error nan"):
        sd.testing.check_rules(lambda x: [2.0 * x, bad(x)], x, second_order=False)
    with pytest.raises(RuleError, match=r"JVP rule disagrees .* relative error nan"):
        sd.testing.check_rules(sin_like(nan_in_jvp=True), x, batch=False)
    with pytest.raises(NonFiniteError, match="outputs hold NaN or infinite values"):
        sd.testing.check_rules(ok, np.array([0.5, NAN]), batch=False)


# ---------------------------------------------------------------------------
# Krylov, Newton, loops and ODE step control: their tests already read NaN as
# failing (`isfinite(x) & (r <= tol)`, a step's `ok`, a bool bound); a NaN
# produced inside each must end in its error


def test_a_krylov_solve_that_breaks_down_to_nan_does_not_converge():
    with pytest.raises(ConvergenceError, match="relative residual nan"):
        sd.linalg.solve(np.zeros((3, 3)), np.ones(3), solver="cg")  # (alpha = 0/0)
    err = judged(judge_krylov, dtype=np.float64, solver="cg", rtol=1e-10,
                 atol=0.0, maxiter=None, converged=False, residual=NAN, iterations=3)
    assert isinstance(err, ConvergenceError) and np.isnan(err.residual)


def test_a_newton_step_through_a_nan_jacobian_is_a_singular_jacobian():
    """`sqrt'(0) = inf`: the step is NaN, and its `ok` (finite and a pivot
    above eps) says the Jacobian is singular."""
    with pytest.raises(ConvergenceError, match="the Jacobian is singular"):
        sd.optimize.root(lambda x: snp.sqrt(x) + x - 1.0, np.zeros(2), jac="dense")


def test_a_nan_carry_under_a_nan_safe_predicate_reaches_the_loop_bound():
    """The bound is a bool and a count; the predicate is the user's, and the
    documented form `~(err <= tol)` keeps a NaN iterate running into it."""
    def run(x0):
        step = lambda s: (snp.sqrt(s[0]) - 1.0, s[1] + 1)  # noqa: E731 (NaN from x < 0)
        return sd.while_loop(lambda s: ~(snp.abs(s[0]) <= 1e-12), step, (x0, 0),
                             max_steps=20)

    f = sd.function(run)
    assert int(f(1.0)[1]) == 1
    with pytest.raises(ConvergenceError, match="max_steps=20"):
        f(-2.0)


@pytest.mark.slow
@pytest.mark.parametrize("solver", ["tsit5", "kvaerno5"])
def test_a_nan_vector_field_fails_the_integration(solver):
    """NaN errors reject steps (diffrax: `error < 1` is false for NaN; the
    implicit stages' chord iteration fails on NaN), the step size collapses,
    and the node's check names the time reached."""
    with pytest.raises(ConvergenceError, match="at t = 0.3 ") as err:
        sd.ode.odeint(lambda t, y, a: snp.where(t > 0.3, NAN, -y), np.array([1.0]),
                      np.array([0.0, 1.0]), solver=solver, max_steps=200)
    assert "step size collapsed" in str(err.value)

