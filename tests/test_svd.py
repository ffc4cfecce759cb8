"""Thin singular value decompositions: `sd.linalg.svd` against NumPy and JAX,
its rules, and the degeneracy policy (finite, correct derivatives of
cluster-invariant functions at any gap; a clear error for gradients that
depend on the basis inside a cluster or of the null space)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from helpers import assert_gradient_matches_fd
from sciad.errors import DegenerateEigenvalueError, InvalidOptionError


def _matrix(rng, shape, dtype=np.float64):
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


def _with_singular_values(rng, m, n, s, dtype=np.float64):
    k = min(m, n)
    u, _ = np.linalg.qr(_matrix(rng, (m, k), dtype))
    v, _ = np.linalg.qr(_matrix(rng, (n, k), dtype))
    return (u * np.asarray(s)) @ v.conj().T


def _spectral(A):
    """A gauge-invariant function of the decomposition: u sin(s) vh, and s^2."""
    u, s, vh = sd.linalg.svd(A)
    return snp.real((u * snp.expand_dims(snp.sin(s), -2)) @ vh), s ** 2


@pytest.mark.parametrize("dtype", [np.float64, np.complex128, np.float32])
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4)])
def test_values_match_numpy(rng, dtype, shape):
    A = _matrix(rng, shape, dtype)
    u, s, vh = sd.linalg.svd(A)
    un, sn, vhn = np.linalg.svd(A, full_matrices=False)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert np.asarray(s).dtype == np.finfo(dtype).dtype and np.asarray(u).dtype == dtype
    assert u.shape == un.shape and vh.shape == vhn.shape
    np.testing.assert_allclose(s, sn, rtol=tol, atol=tol)
    assert np.all(np.diff(np.asarray(s)) <= 0)
    np.testing.assert_allclose((np.asarray(u) * np.asarray(s)) @ vh, A, atol=20 * tol)
    k = min(shape)
    np.testing.assert_allclose(np.conj(np.asarray(u).T) @ u, np.eye(k), atol=20 * tol)
    np.testing.assert_allclose(vh @ np.conj(np.asarray(vh).T), np.eye(k), atol=20 * tol)
    np.testing.assert_allclose(sd.linalg.svd(A, compute_uv=False), sn, rtol=tol, atol=tol)


@pytest.mark.slow  # (the registry's batching test covers svd by default)
def test_a_stack_and_vmap_match_a_loop(rng):
    As = _matrix(rng, (3, 4, 2))
    np.testing.assert_allclose(sd.linalg.svd(As, compute_uv=False),
                               np.linalg.svd(As, compute_uv=False), rtol=1e-12)
    got = sd.vmap(_spectral)(As)
    for k in range(3):
        for g, want in zip(got, _spectral(As[k])):
            np.testing.assert_allclose(g[k], want, rtol=1e-12, atol=1e-13)
    # and the gradient of a stack, by vmap and by the stacked op
    loss = lambda A: snp.sum(_spectral(A)[0] * A) + snp.sum(_spectral(A)[1])  # noqa: E731
    g = sd.vmap(sd.grad(loss))(As)
    np.testing.assert_allclose(g, sd.grad(loss)(As), rtol=1e-12, atol=1e-13)
    for k in range(3):
        np.testing.assert_allclose(g[k], sd.grad(loss)(As[k]), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("shape, dtype", [  # (the registry checks a real SVD by default)
    pytest.param((5, 3), np.float64, marks=pytest.mark.slow),
    pytest.param((5, 3), np.complex128, marks=pytest.mark.slow),
    pytest.param((3, 4), np.float64, marks=pytest.mark.slow),
    pytest.param((3, 4), np.complex128, marks=pytest.mark.slow)])
def test_rules_of_gauge_invariant_functions(rng, shape, dtype):
    # (complex128 runs by default in the gauge test below, which checks the
    # vectors themselves)
    # JVP against finite differences, VJP by the dot-product test, second
    # order, and batching (sd.testing.check_rules)
    A = _matrix(rng, shape, dtype)
    report = sd.testing.check_rules(_spectral, A)
    assert report.jvp_error < 1e-7 and report.second_order_error < 1e-6
    report = sd.testing.check_rules(lambda A: sd.linalg.svd(A, compute_uv=False) ** 3, A)
    assert report.jvp_error < 1e-7


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), pytest.param((4, 4), marks=pytest.mark.slow)])
def test_gradients_match_jax_away_from_degeneracy(rng, shape):
    A = _matrix(rng, shape)
    k = min(shape)

    def f(A, xp, svd):
        u, s, vh = svd(A)
        return (xp.sum(s ** 3) + xp.sum(u[:, 1] ** 2 * xp.arange(shape[0]))
                + xp.sum(vh[0] * vh[1] * xp.arange(shape[1]))
                + xp.sum((u @ xp.diag(xp.tanh(s)) @ vh) * A) + xp.sum(s[:k] * xp.arange(k)))

    g = sd.grad(lambda A: f(A, snp, sd.linalg.svd))(A)
    with sd.config.x64_scope():
        want = jax.grad(lambda A: f(A, jnp, lambda A: jnp.linalg.svd(A, full_matrices=False)))(A)
    np.testing.assert_allclose(g, want, rtol=1e-10, atol=1e-12)


def test_complex_gradients_match_jax_away_from_degeneracy(rng):
    A = _matrix(rng, (4, 3), np.complex128)

    def f(A, xp, svd):
        u, s, vh = svd(A)
        return xp.sum(s ** 3) + xp.sum(xp.abs(u[:, 1]) ** 2 * xp.arange(4)) + xp.real(
            xp.sum((u[:, :1] @ vh[:1]) * xp.arange(12.0).reshape(4, 3)))

    g = sd.grad(lambda A: f(A, snp, sd.linalg.svd))(A)
    with sd.config.x64_scope():
        want = jax.grad(lambda A: f(A, jnp, lambda A: jnp.linalg.svd(A, full_matrices=False)))(A)
    np.testing.assert_allclose(g, want, rtol=1e-10, atol=1e-12)


def _cases(*default):
    """Every (shape, dtype) pair: `default` ones in the default run, the others
    marked slow (the default suite stays within its time budget)."""
    out = []
    for shape in [(6, 4), (4, 4), (4, 6)]:
        for dtype in [np.float64, np.complex128]:
            marks = () if (shape, dtype) in default else (pytest.mark.slow,)
            out.append(pytest.param(shape, dtype, marks=marks))
    return out


def _gap_cases():
    """Every (gap, shape, dtype): the exact cluster once by default (a
    complex wide matrix), the others slow."""
    default = {(0.0, (4, 6), np.complex128)}
    return [pytest.param(gap, p.values[0], p.values[1],
                         marks=() if (gap,) + tuple(p.values) in default else (pytest.mark.slow,))
            for gap in (0.0, 1e-12, 1e-8) for p in _cases()]


@pytest.mark.parametrize("gap, shape, dtype", _gap_cases())
def test_cluster_invariant_gradients_are_finite_and_right_at_any_gap(rng, gap, shape, dtype):
    A = _with_singular_values(rng, *shape, [5.0, 2.0 + gap, 2.0, 0.5], dtype)
    M, N = _matrix(rng, shape), _matrix(rng, (shape[0], shape[0]))

    def vectors(A, usv=None):  # the cluster {1, 2}: u_c vh_c, u_c u_c^H, u_c s_c vh_c
        u, s, vh = sd.linalg.svd(A) if usv is None else usv
        uc, vhc = u[:, 1:3], vh[1:3]
        return (snp.sum(snp.real(uc @ vhc) * M) + snp.sum(snp.real(uc @ snp.conj(uc.T)) * N)
                + snp.sum(snp.real(A @ snp.conj(vhc.T) @ vhc) * M))

    def values(A, s=None):  # the sum of s_c, and s^2
        s = sd.linalg.svd(A, compute_uv=False) if s is None else s
        return 3.0 * snp.sum(s[1:3]) + snp.sum(s ** 2)

    # against central finite differences, and forward mode agrees
    d = _matrix(rng, shape, dtype)
    assert_gradient_matches_fd(vectors, A, d, forward=True)
    assert_gradient_matches_fd(values, A, d, forward=True)
    # added, they are two decompositions (`compute_uv=False` is its own
    # node), each checked, and right
    assert_gradient_matches_fd(lambda A: vectors(A) + values(A), A, d)

    # the singular values and vectors of one call used together: first-order
    # information cannot tell this from a function weighting the cluster's
    # vectors by its singular values, so it is refused
    def together(A):
        usv = sd.linalg.svd(A)
        return vectors(A, usv) + values(A, usv[1])

    with pytest.raises(DegenerateEigenvalueError,
                       match=r"from `svd\(A, compute_uv=False\)`"):
        sd.grad(together)(A)


def test_calls_repeated_on_one_matrix_are_one_decomposition(rng):
    # s[1] and s[2] of a cluster have no derivative apart; their sum has,
    # u_c vh_c, also when each comes from its own call (one node before any
    # derivative)
    u, _ = np.linalg.qr(rng.standard_normal((5, 4)))
    v, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    A = (u * np.array([5.0, 2.0, 2.0, 0.5])) @ v.T
    want = u[:, 1:3] @ v[:, 1:3].T
    g = sd.grad(lambda A: sd.linalg.svd(A)[1][1] + sd.linalg.svd(A)[1][2])(A)
    np.testing.assert_allclose(g, want, atol=1e-13)


@pytest.mark.slow
def test_repeated_calls_of_singular_values_alone(rng):
    A = _with_singular_values(rng, 5, 4, [5.0, 2.0, 2.0, 0.5])
    d = _matrix(rng, (5, 4))
    want = assert_gradient_matches_fd(lambda A: snp.sum(sd.linalg.svd(A)[1][1:3]), A, d)
    g = assert_gradient_matches_fd(
        lambda A: sd.linalg.svd(A, compute_uv=False)[1] + sd.linalg.svd(A, compute_uv=False)[2],
        A, d, forward=True)
    np.testing.assert_allclose(g, want, rtol=1e-13, atol=1e-15)


def test_a_smooth_loss_weighting_a_cluster_unequally_raises(rng):
    # u_c diag(s_c) vh_c is smooth, but at a cluster its derivative needs how
    # the cluster splits, which (s, u, vh)'s tangents do not carry
    A = _with_singular_values(rng, 5, 4, [5.0, 2.0, 2.0, 0.5])
    M = _matrix(rng, (5, 4))

    def f(A):
        u, s, vh = sd.linalg.svd(A)
        return snp.sum((u[:, 1:3] @ snp.diag(s[1:3]) @ vh[1:3]) * M)

    with pytest.raises(DegenerateEigenvalueError, match=r"A @ vh_c\^H @ vh_c"):
        sd.grad(f)(A)


# (1e-12: slow; inside the cluster tolerance as 1e-8 is, the exact cluster 0.0
# and the gap 1e-8 near the tolerance run by default)
@pytest.mark.parametrize("gap", [0.0, pytest.param(1e-12, marks=pytest.mark.slow), 1e-8])
def test_basis_dependent_gradients_in_a_cluster_raise(rng, gap):
    A = _with_singular_values(rng, 5, 4, [5.0, 2.0 + gap, 2.0, 0.5])
    with pytest.raises(DegenerateEigenvalueError,
                       match=r"linalg.svd: singular values 1..2 .* one cluster .* the choice "
                             r"of singular vectors inside the cluster"):
        sd.grad(lambda A: snp.sum(sd.linalg.svd(A)[0][:, 1] ** 2 * snp.arange(5.0)))(A)
    with pytest.raises(DegenerateEigenvalueError, match="one singular value of the cluster"):
        sd.grad(lambda A: sd.linalg.svd(A, compute_uv=False)[1])(A)
    with pytest.raises(DegenerateEigenvalueError, match="one singular value of the cluster"):
        sd.grad(lambda A: sd.linalg.svd(A)[1][2])(A)


def test_a_lower_tolerance_resolves_a_small_gap(rng):
    A = _with_singular_values(rng, 5, 4, [5.0, 2.0 + 1e-6, 2.0, 0.5])

    def f(A, xp, svd):
        return xp.sum(svd(A)[0][:, 1] ** 2 * xp.arange(5.0))

    with pytest.raises(DegenerateEigenvalueError):
        sd.grad(lambda A: f(A, snp, lambda A: sd.linalg.svd(A, degenerate_tol=1e-5)))(A)
    g = sd.grad(lambda A: f(A, snp, lambda A: sd.linalg.svd(A, degenerate_tol=1e-9)))(A)
    with sd.config.x64_scope():
        want = jax.grad(lambda A: f(A, jnp, lambda A: jnp.linalg.svd(A, full_matrices=False)))(A)
    np.testing.assert_allclose(g, want, rtol=1e-6)


def test_the_phase_of_complex_singular_vectors_is_a_gauge(rng):
    A = _matrix(rng, (4, 3), np.complex128)
    with pytest.raises(DegenerateEigenvalueError, match="phase of singular vectors 1"):
        sd.grad(lambda A: snp.real(snp.sum(sd.linalg.svd(A)[0][:, 1])))(A)
    M = _matrix(rng, (4, 3))

    def f(A):  # u_1 v_1^H: the common phase cancels
        u, s, vh = sd.linalg.svd(A)
        return snp.sum(snp.real(u[:, 1:2] @ vh[1:2]) * M)

    assert_gradient_matches_fd(f, A, _matrix(rng, (4, 3), np.complex128))


@pytest.mark.parametrize("shape, dtype", _cases(((6, 4), np.float64), ((4, 4), np.complex128),
                                                 ((4, 6), np.float64)))
def test_zero_singular_values(rng, shape, dtype):
    # rank 2: two zero singular values; s^2 and u s^3 vh are smooth there
    A = _with_singular_values(rng, *shape, [3.0, 1.5, 0.0, 0.0], dtype)
    M = _matrix(rng, shape)

    def f(A):
        u, s, vh = sd.linalg.svd(A)
        return snp.sum(s ** 2) + snp.sum(snp.real(u @ snp.diag(s ** 3) @ vh) * M)

    assert_gradient_matches_fd(f, A, _matrix(rng, shape, dtype))
    with pytest.raises(DegenerateEigenvalueError, match="are zero .*a basis of a null space"):
        sd.grad(lambda A: snp.sum(snp.abs(sd.linalg.svd(A)[0][:, 3]) ** 2
                                  * snp.arange(shape[0])))(A)
    # the nuclear norm has only a subgradient there
    with pytest.raises(DegenerateEigenvalueError, match="not smooth there"):
        sd.grad(lambda A: snp.sum(sd.linalg.svd(A, compute_uv=False)))(A)


def test_bad_input_is_refused_at_trace_time():
    with pytest.raises(sd.errors.ShapeError, match="linalg.svd.*must be a matrix"):
        sd.linalg.svd(np.ones(3))
    with pytest.raises(InvalidOptionError, match="thin SVD"):
        sd.linalg.svd(np.ones((3, 2)), full_matrices=True)
    with pytest.raises(sd.errors.ShapeError, match="sparse matrix"):
        sd.linalg.svd(sd.sparse.from_dense(np.eye(3)))
    s = sd.linalg.svd(np.diag([3, 1, 2]), compute_uv=False)  # integers: float64
    np.testing.assert_array_equal(s, [3.0, 2.0, 1.0])


@pytest.mark.parametrize("dtype", [pytest.param(np.float64, marks=pytest.mark.slow),
                                   np.complex128])
def test_check_rules_compares_singular_vectors_up_to_sign_or_phase(rng, dtype):
    A = _matrix(rng, (5, 3), dtype)
    report = sd.testing.check_rules(lambda A: sd.linalg.svd(A), A,
                                    gauge={0: "columns", 2: "rows"})
    assert report.jvp_error < 1e-8 and report.second_order_error < 1e-8


def test_a_special_basis_does_not_hide_a_basis_dependent_loss():
    # as for eigh: at diag(3, 2, 2) (and at zero singular values) LAPACK's
    # unit vectors would let one singular vector's square pass
    for s in ([3.0, 2.0, 2.0], [3.0, 0.0, 0.0]):
        A = np.zeros((4, 3))
        A[:3, :3] = np.diag(s)
        with pytest.raises(DegenerateEigenvalueError):
            sd.grad(lambda A: sd.linalg.svd(A)[0][1, 1] ** 2)(A)
