"""Dense Hermitian eigendecompositions: `sd.linalg.eigh` / `eigvalsh` against
NumPy and JAX, their rules, and the degeneracy policy (finite, correct
derivatives of cluster-invariant functions at any gap; a clear error for
gradients that depend on the basis inside a cluster)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from helpers import assert_gradient_matches_fd
from sciad.errors import DegenerateEigenvalueError, InvalidOptionError


def _hermitian(rng, n, dtype=np.float64):
    a = rng.standard_normal((n, n))
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal((n, n))
    return ((a + a.conj().T) / 2).astype(dtype)


def _with_spectrum(rng, w):
    q, _ = np.linalg.qr(rng.standard_normal((len(w), len(w))))
    return (q * np.asarray(w)) @ q.T


def _spectral(A):
    """A gauge-invariant function of the decomposition: v f(w) v^H, and w."""
    w, v = sd.linalg.eigh(A)
    return snp.real(v @ snp.diag(snp.exp(w / 4)) @ snp.conj(v.T)), w ** 2


@pytest.mark.parametrize("dtype", [np.float64, np.complex128, np.float32])
def test_values_and_vectors_match_numpy(rng, dtype):
    A = _hermitian(rng, 6, dtype)
    w, v = sd.linalg.eigh(A)
    wn, _ = np.linalg.eigh(A)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert np.asarray(w).dtype == np.finfo(dtype).dtype and np.asarray(v).dtype == dtype
    np.testing.assert_allclose(w, wn, rtol=tol, atol=tol)
    assert np.all(np.diff(np.asarray(w)) >= 0)
    np.testing.assert_allclose(A @ v, np.asarray(v) * np.asarray(w), atol=50 * tol)
    np.testing.assert_allclose(np.conj(np.asarray(v).T) @ v, np.eye(6), atol=50 * tol)
    np.testing.assert_allclose(sd.linalg.eigvalsh(A), wn, rtol=tol, atol=tol)


def test_a_stack_and_vmap_match_a_loop(rng):
    As = np.stack([_hermitian(rng, 4) for _ in range(3)])
    w, _ = sd.linalg.eigh(As)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(As), rtol=1e-12)
    got = sd.vmap(_spectral)(As)
    for k in range(3):
        for g, want in zip(got, _spectral(As[k])):
            np.testing.assert_allclose(g[k], want, rtol=1e-12, atol=1e-13)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_rules_of_gauge_invariant_functions(rng, dtype):
    # (by default, the registry checks a real eigh's invariant functions and
    # the gauge test below the vectors themselves, in complex128)
    # JVP against finite differences, VJP by the dot-product test, second
    # order, and batching (sd.testing.check_rules)
    A = _hermitian(rng, 5, dtype)
    report = sd.testing.check_rules(_spectral, A)
    assert report.jvp_error < 1e-7 and report.second_order_error < 1e-6


def test_gradients_match_jax_away_from_degeneracy(rng):
    A = _hermitian(rng, 5)

    def f(A, xp, eigh):
        w, v = eigh(A)
        return xp.sum(w ** 3) + xp.sum(v[:, 1] ** 2 * xp.arange(5.0)) + xp.sum(
            (v @ xp.diag(xp.tanh(w)) @ v.T) * A)

    g = sd.grad(lambda A: f(A, snp, sd.linalg.eigh))(A)
    with sd.config.x64_scope():
        want = jax.grad(lambda A: f((A + A.T) / 2, jnp, jnp.linalg.eigh))(A)
    np.testing.assert_allclose(g, want, rtol=1e-10, atol=1e-12)


# (1e-12: slow; inside the cluster tolerance as 1e-8 is, the exact cluster 0.0
# and the gap 1e-8 near the tolerance run by default)
@pytest.mark.parametrize("gap", [0.0, pytest.param(1e-12, marks=pytest.mark.slow), 1e-8])
def test_cluster_invariant_gradients_are_finite_and_right_at_any_gap(rng, gap):
    A = _with_spectrum(rng, [1.0, 2.0, 2.0 + gap, 3.5, 5.0])
    M = rng.standard_normal((5, 5))

    def f(A):  # a spectral function, a cluster's eigenvalue sum, a symmetric function
        w = sd.linalg.eigvalsh(A)
        return (snp.sum(sd.linalg.funm_hermitian(A, "exp") * M) + 3.0 * snp.sum(w[1:3])
                + snp.sum(w ** 2) + w[0])

    # against central finite differences of the (smooth) cluster functions,
    # and forward mode agrees
    assert_gradient_matches_fd(f, A, _hermitian(rng, 5), forward=True)


@pytest.mark.slow  # (the default suite's time budget)
def test_spectral_functions_at_a_multiple_of_the_identity(rng):
    # every eigenvalue repeated: the divided differences are all f'(2)
    d = _hermitian(rng, 4)
    for fn, df in (("exp", np.exp(2.0)), ("log", 0.5), ("sqrt", 0.5 / np.sqrt(2.0)),
                   ("inv_sqrt", -0.25 / np.sqrt(2.0)), ("inv", -0.25)):
        _, t = sd.jvp(lambda A: sd.linalg.funm_hermitian(A, fn), (2.0 * np.eye(4),), (d,))
        np.testing.assert_allclose(t, df * d, rtol=1e-12, atol=1e-14)
    # first order at repeated eigenvalues; second order away from them (its
    # rule at repeated eigenvalues is not exact yet: see funm_hermitian)
    report = sd.testing.check_rules(lambda A: sd.linalg.funm_hermitian(A, "log"),
                                    _with_spectrum(rng, [1.0, 2.0, 2.0, 3.0]),
                                    second_order=False)
    assert report.jvp_error < 1e-6 and report.vjp_error < 1e-10
    report = sd.testing.check_rules(lambda A: sd.linalg.funm_hermitian(A, "log"),
                                    _with_spectrum(rng, [1.0, 2.0, 2.5, 3.0]))
    assert report.second_order_error < 1e-6
    with pytest.raises(sd.errors.NotPositiveDefiniteError, match="smallest eigenvalue"):
        sd.linalg.funm_hermitian(-np.eye(3), "sqrt")
    with pytest.raises(InvalidOptionError, match="must be one of"):
        sd.linalg.funm_hermitian(np.eye(3), "cos")


# (1e-12: slow; inside the cluster tolerance as 1e-8 is, the exact cluster 0.0
# and the gap 1e-8 near the tolerance run by default)
@pytest.mark.parametrize("gap", [0.0, pytest.param(1e-12, marks=pytest.mark.slow), 1e-8])
def test_basis_dependent_gradients_in_a_cluster_raise(rng, gap):
    A = _with_spectrum(rng, [1.0, 2.0, 2.0 + gap, 3.5, 5.0])
    with pytest.raises(DegenerateEigenvalueError,
                       match=r"linalg.eigh: eigenvalues 1..2 .* one cluster .* the "
                             r"eigenvectors of the cluster"):
        sd.grad(lambda A: snp.sum(sd.linalg.eigh(A)[1][:, 1] ** 2 * snp.arange(5.0)))(A)
    with pytest.raises(DegenerateEigenvalueError, match="one eigenvalue of the cluster"):
        sd.grad(lambda A: sd.linalg.eigvalsh(A)[1])(A)


def test_a_spectral_function_written_out_raises_at_a_cluster():
    # v (w - 2) v^T at A = diag(1, 2, 2, 3): the eigenvectors of the cluster
    # get no cotangent (f(2) = 0), its eigenvalues do, and their derivative
    # depends on the basis: refused (funm_hermitian is the way)
    A = np.diag([1.0, 2.0, 2.0, 3.0])

    def f(A):
        w, v = sd.linalg.eigh(A)
        return snp.sum(v @ snp.diag(w - 2.0) @ v.T)

    with pytest.raises(DegenerateEigenvalueError, match="together with eigenvectors"):
        sd.grad(f)(A)
    # a simple eigenpair next to a cluster differentiates
    g = sd.grad(lambda A: sd.linalg.eigh(A)[1][0, 0] ** 2 + sd.linalg.eigvalsh(A)[3])(A)
    assert np.all(np.isfinite(g))


def test_a_lower_tolerance_resolves_a_small_gap(rng):
    A = _with_spectrum(rng, [1.0, 2.0, 2.0 + 1e-6, 3.5, 5.0])

    def f(A, xp, eigh):
        return xp.sum(eigh(A)[1][:, 1] ** 2 * xp.arange(5.0))

    with pytest.raises(DegenerateEigenvalueError):
        sd.grad(lambda A: f(A, snp, lambda A: sd.linalg.eigh(A, degenerate_tol=1e-5)))(A)
    g = sd.grad(lambda A: f(A, snp, lambda A: sd.linalg.eigh(A, degenerate_tol=1e-9)))(A)
    with sd.config.x64_scope():
        want = jax.grad(lambda A: f((A + A.T) / 2, jnp, jnp.linalg.eigh))(A)
    np.testing.assert_allclose(g, want, rtol=1e-6)


def test_the_phase_of_a_complex_eigenvector_is_a_gauge(rng):
    A = _hermitian(rng, 4, np.complex128)
    with pytest.raises(DegenerateEigenvalueError, match="phase of eigenvector"):
        sd.grad(lambda A: snp.real(snp.sum(sd.linalg.eigh(A)[1][:, 2])))(A)
    g = sd.grad(lambda A: snp.sum(snp.abs(sd.linalg.eigh(A)[1][:, 2]) ** 2 * snp.arange(4.0)))(A)
    assert np.all(np.isfinite(g))


def test_bad_input_is_refused_at_trace_time(rng):
    with pytest.raises(sd.errors.ShapeError, match="square matrix"):
        sd.linalg.eigh(np.ones((3, 4)))
    with pytest.raises(sd.errors.ShapeError, match="sparse matrix"):
        sd.linalg.eigh(sd.sparse.from_dense(np.eye(3)))
    # an option's value is not a shape, and a NumPy number prints as a number
    for tol, shown in ((np.float64(-1.0), "-1.0"), (np.nan, "nan")):
        with pytest.raises(InvalidOptionError, match=rf"`degenerate_tol` must be >= 0, got "
                                                     rf"{shown}\.\n"):
            sd.linalg.eigh(np.eye(3), degenerate_tol=tol)
    w = sd.linalg.eigvalsh(np.diag([3, 1, 2]))  # integers compute in float64
    np.testing.assert_array_equal(w, [1.0, 2.0, 3.0])


def test_the_generalized_problem_matches_scipy_and_differentiates(rng):
    import scipy.linalg as sla

    A = _hermitian(rng, 5)
    M = rng.standard_normal((5, 5))
    B = M @ M.T + 5 * np.eye(5)
    w, v = sd.linalg.eigh(A, B)
    wn, _ = sla.eigh(A, B)
    np.testing.assert_allclose(w, wn, rtol=1e-12)
    np.testing.assert_allclose(A @ v, B @ np.asarray(v) * np.asarray(w), atol=1e-11)
    np.testing.assert_allclose(np.asarray(v).T @ B @ v, np.eye(5), atol=1e-12)

    def f(A, B):
        w, v = sd.linalg.eigh(A, B)
        return w ** 2, v @ snp.diag(snp.sin(w)) @ v.T

    report = sd.testing.check_rules(f, A, B)
    assert report.jvp_error < 1e-7 and report.second_order_error < 1e-6


def test_a_mass_matrix_with_repeated_eigenvalues_is_harmless(rng):
    # B = 2 I: every eigenvalue of B repeated, and B^(-1/2) still differentiates
    A = _hermitian(rng, 4)
    g = sd.grad(lambda B: snp.sum(sd.linalg.eigvalsh(A, B) ** 2))(2.0 * np.eye(4))
    w = np.linalg.eigvalsh(A / 2.0)
    v = np.linalg.eigh(A)[1]
    # d/dB of sum(w^2) at B = 2I: -sum_i 2 w_i^2 v_i v_i^T / 2 (w_i = lambda_i(A) / 2)
    want = -(v * (w ** 2)) @ v.T
    np.testing.assert_allclose(g, want, rtol=1e-10, atol=1e-12)


def test_a_mass_matrix_that_is_not_positive_definite_raises(rng):
    A = _hermitian(rng, 4)
    with pytest.raises(sd.errors.NotPositiveDefiniteError, match="smallest eigenvalue is -1"):
        sd.linalg.eigh(A, np.diag([1.0, 2.0, -1.0, 3.0]))
    with pytest.raises(sd.errors.ShapeError, match="`B` must have `A`'s shape"):
        sd.linalg.eigh(A, np.eye(3))


# (1e-12: slow; inside the cluster tolerance as 1e-8 is, the exact cluster 0.0
# and the gap 1e-8 near the tolerance run by default)
@pytest.mark.parametrize("gap", [0.0, pytest.param(1e-12, marks=pytest.mark.slow), 1e-8])
def test_a_cluster_projector_differentiates_at_any_gap(rng, gap):
    # P_c = v_c v_c^T is smooth where the cluster is apart from the rest of
    # the spectrum, whatever its own spread: reverse and forward mode
    A = _with_spectrum(rng, [1.0, 2.0, 2.0 + gap, 3.5, 5.0])
    M = rng.standard_normal((5, 5))

    def f(A):
        vc = sd.linalg.eigh(A)[1][:, 1:3]
        return snp.sum((vc @ vc.T) * M)

    assert_gradient_matches_fd(f, A, _hermitian(rng, 5), forward=True)


def test_forward_mode_is_checked_at_a_cluster(rng):
    # forward mode transposes its tangent map once (random cotangent), so
    # the guards judge it as they judge reverse mode
    A = _with_spectrum(rng, [1.0, 2.0, 2.0, 3.5, 5.0])
    d = _hermitian(rng, 5)
    for f in (lambda A: sd.linalg.eigvalsh(A)[1],
              lambda A: snp.sum(sd.linalg.eigh(A)[1][:, 1] ** 2 * snp.arange(5.0))):
        with pytest.raises(DegenerateEigenvalueError, match="eigenvalues 1..2"):
            sd.jvp(f, (A,), (d,))
    with pytest.raises(DegenerateEigenvalueError, match="eigenvalues 1..2"):
        sd.jacfwd(lambda A: sd.linalg.eigvalsh(A)[:3])(A)
    with pytest.raises(DegenerateEigenvalueError, match="eigenvalues 1..2"):
        jax.jvp(sd.to_jax(lambda A: sd.linalg.eigvalsh(A)[1]), (A,), (d,))
    # second order: the Hessian of a symmetric function of a cluster's
    # eigenvalues needs the whole block v_c^T dA v_c (funm_hermitian's rule),
    # which eigh's tangents do not carry: refused
    with pytest.raises(DegenerateEigenvalueError, match="eigenvalues 1..2"):
        sd.hvp(lambda A: snp.sum(sd.linalg.eigvalsh(A)[1:3] ** 2), A, d)

    # the cluster's sum: forward mode and its Hessian are right
    def cluster(A):
        return snp.sum(sd.linalg.eigvalsh(A)[1:3])

    g = sd.grad(cluster)
    h = 1e-6
    want = (np.asarray(g(A + h * d)) - np.asarray(g(A - h * d))) / (2 * h)
    np.testing.assert_allclose(sd.hvp(cluster, A, d), want, atol=1e-7)
    np.testing.assert_allclose(sd.jvp(cluster, (A,), (d,))[1], np.sum(g(A) * d), rtol=1e-12)


@pytest.mark.parametrize("dtype", [pytest.param(np.float64, marks=pytest.mark.slow),
                                   np.complex128])
def test_check_rules_compares_eigenvectors_up_to_sign_or_phase(rng, dtype):
    # gauge={1: "columns"}: each eigenvector's phase fixed by its largest
    # entry, so the whole derivative of v is checked (not only invariants)
    from sciad.primitives._eigen import eigh_p

    A = _hermitian(rng, 4, dtype)
    report = sd.testing.check_rules(eigh_p, A, degenerate_tol=1.5e-8, gauge={1: "columns"})
    assert report.jvp_error < 1e-8 and report.second_order_error < 1e-8
    if dtype == np.complex128:  # the raw vectors: LAPACK's phases are not the JVP's gauge
        with pytest.raises(sd.errors.RuleError, match="finite differences"):
            sd.testing.check_rules(eigh_p, A, degenerate_tol=1.5e-8, batch=False)
    with pytest.raises(InvalidOptionError, match="'columns' or 'rows'"):
        sd.testing.check_rules(eigh_p, A, degenerate_tol=1.5e-8, gauge={1: "diagonal"})


def test_a_special_basis_does_not_hide_a_basis_dependent_loss(rng):
    # At diag(1, 2, 2, 3) LAPACK's cluster basis is (e1, e2), where (v_1)_1^2
    # has the cotangent of the invariant P_11 (both stationary under rotations
    # in the cluster). eigh turns each cluster's basis by a fixed random
    # rotation, so the guard's first-order test sees the difference.
    A = np.diag([1.0, 2.0, 2.0, 3.0])
    w, v = (np.asarray(x) for x in sd.linalg.eigh(A))
    np.testing.assert_allclose(A @ v, v * w, atol=1e-14)
    np.testing.assert_allclose(v.T @ v, np.eye(4), atol=1e-14)
    assert abs(v[1, 1]) < 1 - 1e-3  # not LAPACK's unit vector
    with pytest.raises(DegenerateEigenvalueError, match="eigenvectors of the cluster"):
        sd.grad(lambda A: sd.linalg.eigh(A)[1][1, 1] ** 2)(A)

    def p11(A):  # the cluster projector's entry: invariant, differentiable
        vc = sd.linalg.eigh(A)[1][:, 1:3]
        return (vc @ vc.T)[1, 1]

    d = _hermitian(rng, 4)
    g = np.asarray(sd.grad(p11)(A))
    fd = (float(p11(A + 1e-5 * d)) - float(p11(A - 1e-5 * d))) / 2e-5
    np.testing.assert_allclose(np.sum(g * d), fd, atol=1e-8)


def test_calls_repeated_on_one_matrix_are_one_decomposition(rng):
    # each of eigvalsh(A)[1] and eigvalsh(A)[2] alone has no derivative at
    # w_1 = w_2; their sum has: the cluster's projector v_c v_c^T. Two calls
    # on one matrix are one node before any derivative, so the guard judges
    # the whole function, as with one call
    q, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    A = (q * np.array([1.0, 2.0, 2.0, 3.5])) @ q.T
    d = _hermitian(rng, 4)
    want = q[:, 1:3] @ q[:, 1:3].T

    def two(A):
        return sd.linalg.eigvalsh(A)[1] + sd.linalg.eigh(A)[0][2]

    np.testing.assert_allclose(sd.grad(two)(A), want, atol=1e-13)
    np.testing.assert_allclose(sd.jvp(two, (A,), (d,))[1], np.sum(want * d), atol=1e-13)


@pytest.mark.slow
def test_repeated_calls_under_every_transform(rng):
    A = _with_spectrum(rng, [1.0, 2.0, 2.0, 3.5])
    d = _hermitian(rng, 4)

    def one(A):
        w = sd.linalg.eigvalsh(A)
        return w[1] + w[2]

    def two(A):
        return sd.linalg.eigvalsh(A)[1] + sd.linalg.eigvalsh(A)[2]

    def recomputed(A):  # A @ A.T twice: equal nodes, merged first
        return sd.linalg.eigvalsh(A @ A.T)[1] + sd.linalg.eigvalsh(A @ A.T)[2]

    want = assert_gradient_matches_fd(one, A, d)
    np.testing.assert_allclose(sd.jacrev(two)(A), want, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(jax.grad(sd.to_jax(two))(A), want, rtol=1e-13, atol=1e-15)
    _, t = jax.jvp(sd.to_jax(two), (A,), (d,))
    np.testing.assert_allclose(t, np.sum(want * d), rtol=1e-12)
    g = sd.grad(two)
    fd = (np.asarray(g(A + 1e-6 * d)) - np.asarray(g(A - 1e-6 * d))) / 2e-6
    np.testing.assert_allclose(sd.hvp(two, A, d), fd, atol=1e-7)
    B = _with_spectrum(rng, [1.0, np.sqrt(2.0), np.sqrt(2.0), 2.0])  # B B^T: w_1 = w_2
    assert_gradient_matches_fd(recomputed, B, d, forward=True)
    # a function without a derivative is refused as before, however many calls
    with pytest.raises(DegenerateEigenvalueError, match="one eigenvalue of the cluster"):
        sd.grad(lambda A: sd.linalg.eigvalsh(A)[1] + 2.0 * sd.linalg.eigvalsh(A)[2])(A)


def test_an_eigenvalue_sum_with_a_projector_term_through_the_trace(rng):
    # a cluster's eigenvalues and eigenvectors of one decomposition are not
    # differentiated together (first order cannot tell their sum from a
    # basis-dependent v f(w) v^T); the message says to write the eigenvalue
    # sum as trace(v_c^T A v_c), which differentiates
    A = _with_spectrum(rng, [1.0, 2.0, 2.0, 3.5])
    M = rng.standard_normal((4, 4))

    def together(A):
        w, v = sd.linalg.eigh(A)
        vc = v[:, 1:3]
        return snp.sum(w[1:3]) + snp.sum((vc @ vc.T) * M)

    with pytest.raises(DegenerateEigenvalueError, match=r"trace\(v_c\^H A v_c\)"):
        sd.grad(together)(A)


@pytest.mark.slow
def test_the_advised_trace_form_differentiates(rng):
    A = _with_spectrum(rng, [1.0, 2.0, 2.0, 3.5])
    M = rng.standard_normal((4, 4))

    def through_trace(A):
        vc = sd.linalg.eigh(A)[1][:, 1:3]
        return snp.trace(vc.T @ A @ vc) + snp.sum((vc @ vc.T) * M)

    assert_gradient_matches_fd(through_trace, A, _hermitian(rng, 4))
