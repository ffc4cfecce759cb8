"""The cuDSS solver record ("cudss", `sciad.solvers.direct._cudss`).

On the CPU: the extension builds and loads and its handlers register as CUDA
FFI targets (where the `[cuda]` extra is installed); "cudss" refuses cleanly
without a GPU, through solves, gradients and `sd.to_jax`; "auto" never picks
it. The record's rules, batching, failure modes and factor lifetime run
through a host stand-in of the kernel interface (`_cudss.StandIn`: KLU's
kernels with a ledger of live handles).

The same tests run on the real FFI path where marked `gpu` (`pytest -m gpu`;
skipped without an NVIDIA GPU as JAX's default backend, left out of the
default run), plus the GPU-only ones at the end."""

from __future__ import annotations

import shutil
import threading

import jax
import numpy as np
import pytest
import scipy.sparse as sp
try:  # (where JAX keeps CPU custom-call registrations; gone in some versions)
    from jaxlib import xla_client
except ImportError:  # pragma: no cover
    xla_client = None

import sciad as sd
import sciad.numpy as snp
from sciad.graph._types import Pattern
from sciad.errors import (NonFiniteError, NotPositiveDefiniteError, NotSupportedError,
                          SingularMatrixError)
from sciad.solvers.direct import _cudss, _cudss_build, _cudss_ffi, _klu_ffi
from sciad.solvers._linear import choose
from sciad.solvers._registry import lookup
from helpers import assert_vmap_of_sparse_solves, rss_mib
from test_linalg import _csr, _general_csr, _spd_csr


def _extra_installed() -> bool:
    try:
        _cudss_build.paths()
        _cudss_build.compiler()
    except NotSupportedError:
        return False
    return True


needs_extra = pytest.mark.skipif(not _extra_installed(), reason=(
    "the [cuda] extra (nvidia-cudss-cu12, nvidia-cuda-runtime-cu12, nvidia-cuda-nvcc-cu12) "
    "or a C++ compiler is missing: `pip install '.[cuda]'`"))
needs_gpu = pytest.mark.skipif(not _cudss_ffi.gpu_backend(),
                               reason="needs an NVIDIA GPU as JAX's default backend")


@pytest.fixture(params=[pytest.param("standin", marks=pytest.mark.skipif(
                            not _klu_ffi.available(), reason="the stand-in needs klujax")),
                        pytest.param("gpu", marks=[pytest.mark.gpu, needs_gpu])])
def kernels(request):
    """The kernels the record calls: the host stand-in, or cuDSS's FFI; each
    answers `live()`, the factors made and not freed."""
    k = _cudss.StandIn() if request.param == "standin" else _cudss_ffi.KERNELS
    with _cudss.use_kernels(k):
        before = k.live()
        yield k
        assert k.live() == before, "a factor was not freed"


def _loss(d, b, M):
    return snp.sum(sd.linalg.solve(_csr(M)(d), b, solver="cudss") ** 2)


# ---------------------------------------------------------------------------
# the extension, and the refusal without a GPU (CPU)


@needs_extra
def test_the_extension_builds_loads_and_registers():
    """It compiles with the system compiler against the wheels' headers (once:
    cached by source, jaxlib and wheels), links cuDSS (its version answers
    without a GPU), and its four handlers register as CUDA FFI targets."""
    path = _cudss_build.build()
    assert path == _cudss_build.target() and path.is_file()
    stamp = path.stat().st_mtime_ns
    assert _cudss_build.build() == path and path.stat().st_mtime_ns == stamp  # (cached)
    lib = _cudss_build.library()
    assert lib.sciad_cudss_version() >= 10000  # cuDSS >= 1.0 (the transposed solve mode)
    k = _cudss_ffi.CudssKernels()
    k.register()
    names = set()
    for platform in ("CUDA", "gpu"):
        names |= {entry[0] for entry in getattr(xla_client, "_custom_callback", {}).get(
            platform, [])}
    if not _cudss_ffi.gpu_backend():  # (on a GPU they go straight to the plugin)
        assert {f"sciad_cudss_{n}" for n in _cudss_ffi._HANDLERS} <= names
    assert lib.sciad_cudss_live_factors() == 0


@needs_extra
def test_the_kernels_lower_for_cuda(rng):
    """Without a GPU, a program calling the cuDSS kernels (factor, a solve
    and a transposed solve with its handle, a one-call solve, the free;
    under `jax.vmap`) lowers for CUDA: one custom call each, the batch folded
    into the kernels' axis, the pattern and direction as attributes."""
    M = _general_csr(rng, 6)
    P = Pattern(M.shape, M.indptr, M.indices)
    k = _cudss_ffi.KERNELS

    def f(a, b):
        h = k.factor(P, a, "spd")
        x = k.solve(P, h, a, b, False)
        y = k.solve(P, h, a, x, True)
        z = k.solve(P, jax.numpy.zeros((), np.uint64), a, b, True)
        return x + y + z, k.free(h, [x, y])

    names = [f"sciad_cudss_{n}" for n in _cudss_ffi._HANDLERS]
    exp = jax.export.export(
        jax.jit(jax.vmap(f)), platforms=["cuda"],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(n) for n in names])(
        np.stack([M.data] * 3), np.ones((3, 6)))
    calls = [ln for ln in exp.mlir_module().splitlines() if "custom_call @sciad_cudss" in ln]
    for name in names:
        assert any(f"@{name}(" in ln for ln in calls), name
    assert all("tensor<3x" in ln or "tensor<3xui64>" in ln for ln in calls)
    assert any("transpose = true" in ln for ln in calls)
    assert any("transpose = false" in ln for ln in calls)


@pytest.mark.skipif(_cudss_ffi.gpu_backend(), reason="checks the refusal without a GPU")
def test_cudss_refuses_cleanly_without_a_gpu(rng):
    M = _general_csr(rng, 6)
    b = np.ones(6)
    with pytest.raises(NotSupportedError, match=r"NVIDIA GPU.*sciad\[cuda\].*'splu'") as info:
        sd.function(lambda d, b: sd.linalg.solve(_csr(M)(d), b, solver="cudss"))(M.data, b)
    assert "test_cudss.py" in str(info.value)  # (the user's line)
    with pytest.raises(NotSupportedError, match="NVIDIA GPU"):
        sd.function(sd.grad(lambda d, b: _loss(d, b, M)))(M.data, b)
    with pytest.raises(NotSupportedError, match="NVIDIA GPU"), sd.errors.unwrapped():
        jax.jit(jax.grad(sd.to_jax(lambda d: _loss(d, b, M))))(M.data)


def test_auto_never_picks_cudss(monkeypatch):
    f64 = np.dtype(np.float64)
    with _cudss.use_kernels(_cudss.StandIn()):  # (even where it could run)
        assert lookup("cudss").rejects(matrix="sparse", dtype=f64, tags=frozenset()) is None \
            or not _klu_ffi.available()
        for tags in (frozenset(), frozenset({"spd", "symmetric"})):
            assert choose(matrix="sparse", tags=tags, dtype=f64).name != "cudss"
    assert lookup("cudss").preference(matrix="sparse", tags=frozenset(), dtype=f64) is None


def test_the_refusal_says_how_to_get_it(monkeypatch):
    """No extra, no compiler: the message names what to install."""
    k = _cudss_ffi.CudssKernels()
    monkeypatch.setattr(_cudss_ffi, "gpu_backend", lambda: True)
    monkeypatch.setattr(_cudss_build, "_lib", None)
    monkeypatch.setattr(_cudss_build, "_nvidia_dirs", lambda: [])
    assert "pip install 'sciad[cuda]'" in k.unavailable()
    monkeypatch.undo()
    if not _extra_installed():
        return
    monkeypatch.setattr(_cudss_ffi, "gpu_backend", lambda: True)
    monkeypatch.setattr(_cudss_build, "_lib", None)
    monkeypatch.setenv("CXX", "")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "C++ compiler" in k.unavailable()


def test_the_build_finds_a_cuda_13_layout(monkeypatch, tmp_path):
    """JAX on CUDA 13 (nvidia/cu13 wheels, the crt headers from a toolkit):
    the build takes those, JAX's major version first."""
    for rel in ("nvidia/cu13/include/cudss.h", "nvidia/cu13/lib/libcudss.so.1",
                "nvidia/cu13/include/cuda_runtime.h", "nvidia/cu13/lib/libcudart.so.13",
                "nvidia/cu13/lib/libcublas.so.13", "cuda/include/cuda_runtime.h",
                "cuda/include/crt/host_config.h"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).touch()
    monkeypatch.setattr(_cudss_build, "_nvidia_dirs", lambda: [tmp_path / "nvidia"])
    monkeypatch.setattr(_cudss_build, "_majors", lambda: ["13", "12"])
    monkeypatch.setattr(_cudss_build, "_toolkits", lambda: [tmp_path / "cuda"])
    p = _cudss_build.paths()
    cu13 = tmp_path / "nvidia" / "cu13"
    assert p["major"] == "13"
    assert p["libs"] == [cu13 / "lib" / "libcudss.so.1", cu13 / "lib" / "libcudart.so.13"]
    assert p["includes"] == [cu13 / "include", tmp_path / "cuda" / "include"]
    assert p["rpath"] == [cu13 / "lib"]
    (tmp_path / "cuda/include/crt/host_config.h").unlink()
    with pytest.raises(NotSupportedError, match="crt/host_config.h"):
        _cudss_build.paths()


def test_the_breakdown_names_cholesky_for_an_spd_claim():
    """A failed factorization is judged in the program as the record words
    it: a zero pivot for LU, a Cholesky breakdown where `assume="spd"`."""
    record = lookup("cudss")
    assert record.breakdown_for(frozenset())[0] is SingularMatrixError
    cls, message, _ = record.breakdown_for(frozenset({"spd", "symmetric"}))
    assert cls is NotPositiveDefiniteError and "Cholesky" in message and "cudss" in message
    assert record.nan_on_breakdown  # (a one-call solve of it: NaN, judged the same)


# ---------------------------------------------------------------------------
# the record through its kernels (the stand-in; the FFI under -m gpu)


@pytest.mark.parametrize("nrhs,transpose", [(None, False), (3, True)])
def test_values_match_scipy(kernels, rng, nrhs, transpose):
    M = _general_csr(rng, 25)
    b = rng.standard_normal(25 if nrhs is None else (25, nrhs))

    def f(d, b):
        A = _csr(M)(d)
        return sd.linalg.solve(A.T if transpose else A, b, solver="cudss")

    D = M.toarray().T if transpose else M.toarray()
    np.testing.assert_allclose(np.asarray(sd.function(f)(M.data, b)), np.linalg.solve(D, b),
                               rtol=1e-10, atol=1e-12)


def test_transposed_solves_by_refactoring(rng):
    """The fallback for a cuDSS without a transposed solve mode: `A^T x = b`
    factors the transpose in the call (the stand-in takes the same path)."""
    M = _general_csr(rng, 12)
    b = rng.standard_normal(12)
    with _cudss.use_kernels(_cudss.StandIn(transpose="refactor")) as k:
        g = sd.function(sd.grad(lambda d, b: _loss(d, b, M), argnums=1))
        D = M.toarray()
        np.testing.assert_allclose(np.asarray(g(M.data, b)),
                                   np.linalg.solve(D.T, 2 * np.linalg.solve(D, b)), rtol=1e-9)
        assert k.live() == 0


@pytest.mark.slow  # ~12 s (check_rules compiles many programs)
def test_rules_general(kernels, rng):
    M = _general_csr(rng, 8)
    b = rng.standard_normal((8, 2))
    sd.testing.check_rules(lambda d, b: snp.sin(sd.linalg.solve(_csr(M)(d), b, solver="cudss")),
                           M.data, b, seed=int(rng.integers(2**31)))


def _spd_loss(M):
    def f(d, b):
        d = 0.5 * (d + sd.sparse.data(_csr(M)(d).T))  # (a symmetric perturbation)
        return sd.linalg.solve(_csr(M, ("spd",))(d), b, solver="cudss") ** 2
    return f


@pytest.mark.slow  # ~15 s
def test_rules_spd(kernels, rng):
    M = _spd_csr(rng, 8)
    sd.testing.check_rules(_spd_loss(M), M.data, rng.standard_normal(8),
                           seed=int(rng.integers(2**31)))


def test_an_spd_gradient_factors_once_for_cholesky(kernels, rng):
    """An SPD matrix: one factor, made for `assume="spd"` (Cholesky on cuDSS),
    read by the forward and the adjoint solve; the gradient is right."""
    M = _spd_csr(rng, 8)
    b = rng.standard_normal(8)
    if isinstance(kernels, _cudss.StandIn):
        kernels.assumed.clear()
    g = sd.function(sd.grad(lambda d, b: snp.sum(_spd_loss(M)(d, b)), argnums=1))(M.data, b)
    x = np.linalg.solve(M.toarray(), b)
    np.testing.assert_allclose(np.asarray(g), np.linalg.solve(M.toarray(), 2 * x),
                               rtol=1e-9)
    if isinstance(kernels, _cudss.StandIn):
        assert kernels.assumed == ["spd"]


def test_a_vmapped_gradient_factors_each_matrix_once(kernels, rng):
    """`sd.vmap` of a gradient in one program: the forward map hands its
    factors to the backward map (made once, for the batch) and the program
    frees them at its end: none is left, the gradients are right."""
    M = _general_csr(rng, 10)
    ds = np.stack([M.data * (1 + 0.1 * k) for k in range(4)])
    bs = rng.standard_normal((4, 10))
    if isinstance(kernels, _cudss.StandIn):
        kernels.assumed.clear()
    g = sd.function(sd.grad(lambda D, B: snp.sum(sd.vmap(lambda d, b: _loss(d, b, M))(D, B))))
    for _ in range(3):
        out = np.asarray(g(ds, bs))
    for k in range(4):
        D = M.toarray() * (1 + 0.1 * k)
        x = np.linalg.solve(D, bs[k])
        lam = np.linalg.solve(D.T, 2 * x)
        rows = np.repeat(np.arange(10), np.diff(M.indptr))
        np.testing.assert_allclose(out[k], -lam[rows] * x[M.indices], rtol=1e-8, atol=1e-12)
    if isinstance(kernels, _cudss.StandIn):  # (one batched factorization traced, not 0)
        assert kernels.assumed == [None]


def test_a_mapped_solve_frees_its_own_factor(kernels, rng):
    """A solve lowered inside a `map` node (an `sd.vmap` graph lowered as
    traced, as `check_rules` runs it) whose result the program reads on:
    its factor is made and freed inside the solve. (The map once took the
    solve's result for a factor handed out to it, freed that instead, and
    left the factor: KLU then crashed on the freed values.)"""
    M = _spd_csr(rng, 8)
    ds = np.stack([M.data, 1.01 * M.data])
    bs = rng.standard_normal((2, 8))

    def f(d, b):
        return sd.linalg.solve(_csr(M, ("spd",))(d), b, solver="cudss") ** 2

    g = sd.trace(sd.vmap(f), ds, bs)
    assert any(n.primitive.name == "map" for n in g.nodes)
    out = np.asarray(jax.jit(sd.graph.lower(g))(ds, bs)[0])
    for j in range(2):
        want = np.linalg.solve(M.toarray() * (1 + 0.01 * j), bs[j]) ** 2
        np.testing.assert_allclose(out[j], want, rtol=1e-9)
    assert kernels.live() == 0


def test_sd_vmap_over_matrices_and_right_hand_sides(kernels, rng):
    assert_vmap_of_sparse_solves("cudss", _general_csr(rng, 10), rng)


def test_to_jax_under_jit_grad_and_vmap(kernels, rng):
    M = _general_csr(rng, 12)
    b = rng.standard_normal(12)
    f = sd.to_jax(lambda d, b: _loss(d, b, M))
    D = M.toarray()
    x = np.linalg.solve(D, b)
    np.testing.assert_allclose(float(jax.jit(f)(M.data, b)), np.sum(x ** 2), rtol=1e-10)
    gb = jax.jit(jax.grad(f, argnums=1))(M.data, b)
    np.testing.assert_allclose(np.asarray(gb), np.linalg.solve(D.T, 2 * x), rtol=1e-9)
    ds = np.stack([M.data, 2 * M.data])
    vals = jax.jit(jax.vmap(f))(ds, np.stack([b, -b]))
    np.testing.assert_allclose(np.asarray(vals), [np.sum(x ** 2), np.sum(x ** 2) / 4],
                               rtol=1e-10)


def test_failure_modes(kernels, rng):
    M = _general_csr(rng, 8)
    b = np.ones(8)
    f = sd.function(lambda d, b: sd.linalg.solve(_csr(M)(d), b, solver="cudss"))
    g = sd.function(sd.grad(lambda d, b: _loss(d, b, M), argnums=(0, 1)))
    one_row = M.data.copy()
    one_row[M.indptr[2]:M.indptr[3]] = 0.0
    with pytest.raises(SingularMatrixError, match="zero pivot") as info:
        f(one_row, b)
    assert "test_cudss.py" in str(info.value)
    # numerically singular (the Neumann Laplacian): a zero pivot, or a
    # backward error no refinement brings down
    L = sp.csr_array(sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], (8, 8)))
    L.sort_indices()
    lap = L.data.copy()
    lap[0] = lap[-1] = 1.0
    with pytest.raises(SingularMatrixError):
        jax.block_until_ready(sd.function(sd.grad(lambda d, b: _loss(d, b, L)))(lap, b))
    bad = M.data.copy()
    bad[3] = np.nan
    with pytest.raises(NonFiniteError):
        f(bad, b)
    with pytest.raises(NonFiniteError):
        g(M.data, np.where(np.arange(8) == 2, np.inf, 1.0))
    np.testing.assert_allclose(np.asarray(f(M.data, b)), np.linalg.solve(M.toarray(), b),
                               rtol=1e-10)  # (still usable afterwards)


#: a singular matrix whose zero pivot only the factorization finds (no zero
#: row or column): rows 0 and 1 are equal; with `_P.data[1] = 2` it is not
_P = sp.csr_array(np.array([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0],
                            [0.0, 0.0, 2.0, 1.0], [0.0, 0.0, 1.0, 3.0]]))


def _p_loss(d, b):
    return snp.sum(sd.linalg.solve(_csr(_P)(d), b, solver="cudss") ** 2)


def test_a_failed_factorization_is_judged_with_the_users_line(kernels):
    """A zero pivot the factorization finds itself: a 0 handle, judged in the
    program, so `SingularMatrixError` with the solver's words and the user's
    line, through a single solve (the one-call path: NaN), a gradient (a kept
    factor) and the user's own `jax.jit(jax.grad(sd.to_jax(f)))`; no factor
    is left (the fixture counts) and the kernels serve the next call. (cuDSS
    may perturb the pivot instead: then the backward error finds it, with the
    same class and line.)"""
    b = np.ones(4)
    f = sd.function(lambda d, b: sd.linalg.solve(_csr(_P)(d), b, solver="cudss"))
    for run in (lambda: f(_P.data, b),
                lambda: sd.function(sd.grad(_p_loss, argnums=(0, 1)))(_P.data, b)):
        with pytest.raises(SingularMatrixError, match="singular") as info:
            jax.block_until_ready(run())
        assert "test_cudss.py" in str(info.value)
    with pytest.raises(SingularMatrixError, match="singular") as info, sd.errors.unwrapped():
        jax.block_until_ready(jax.jit(jax.grad(sd.to_jax(_p_loss)))(_P.data, b))
    assert "test_cudss.py" in str(info.value)
    good = _P.data.copy()
    good[1] = 2.0
    np.testing.assert_allclose(np.asarray(f(good, b)), np.linalg.solve(
        sp.csr_array((good, _P.indices, _P.indptr)).toarray(), b), rtol=1e-12)


def test_a_batch_with_one_failed_factorization_fails_cleanly(kernels):
    """In a batch (cuDSS's uniform batch), one matrix that fails to factor:
    `SingularMatrixError` with the user's line, the other factors released
    (the fixture counts); the same batch without it is right."""
    good = _P.data.copy()
    good[1] = 2.0
    ds = np.stack([good, _P.data, 2 * good])
    g = sd.function(sd.vmap(sd.grad(_p_loss, argnums=(0, 1))))
    bs = np.ones((3, 4))
    bs[:, 1] = 2.0  # (no solution: cuDSS may perturb the zero pivot and solve a nearby system)
    with pytest.raises(SingularMatrixError, match="singular") as info:
        jax.block_until_ready(g(ds, bs))
    assert "test_cudss.py" in str(info.value)
    ds[1] = 3 * good
    gd, _ = g(ds, np.ones((3, 4)))
    D = sp.csr_array((good, _P.indices, _P.indptr)).toarray()
    rows = np.repeat(np.arange(4), np.diff(_P.indptr))
    for j, c in enumerate((1.0, 3.0, 2.0)):
        x = np.linalg.solve(c * D, np.ones(4))
        lam = np.linalg.solve((c * D).T, 2 * x)
        np.testing.assert_allclose(np.asarray(gd[j]), -lam[rows] * x[_P.indices], rtol=1e-9,
                                   atol=1e-14)


class _Perturbing(_cudss.StandIn):
    """A stand-in that factors as cuDSS does by default: a zero pivot
    perturbed to a tiny one (here: the first stored value nudged by 1e-13),
    so a singular matrix factors and solves to a huge `x`."""

    def factor(self, pattern, a, assume=None):
        return super().factor(pattern, a.at[0].add(1e-13), assume)


@pytest.mark.skipif(not _klu_ffi.available(), reason="the stand-in needs klujax")
@pytest.mark.parametrize("where", [0, 1, 2])
def test_a_perturbed_pivot_in_a_batch_is_found_singular(where):
    """cuDSS perturbs a zero pivot instead of failing (seen on an H200): the
    solve of a singular, inconsistent system in a batch then has a residual
    the checks measure, and the host repair's SuperLU finds no factor. The
    batch's worst measure is that example's NaN wherever it sits in the batch
    (a finite measure of a later example once hid it: a warning, then a
    `NonFiniteError` in the adjoint solve)."""
    good = _P.data.copy()
    good[1] = 2.0
    ds = np.stack([good, 2 * good, 3 * good])
    ds[where] = _P.data
    bs = np.ones((3, 4))
    bs[:, 1] = 2.0
    with _cudss.use_kernels(_Perturbing()) as k:
        with pytest.raises(SingularMatrixError, match="singular") as info:
            jax.block_until_ready(sd.function(sd.vmap(sd.grad(_p_loss, argnums=(0, 1))))(
                ds, bs))
        assert "test_cudss.py" in str(info.value)
        assert f"in example [{where}] of a batch of 3" in str(info.value)
        assert k.live() == 0


@pytest.mark.gpu
@needs_gpu
def test_gpu_an_indefinite_matrix_claimed_spd_fails_cholesky(rng):
    """A symmetric matrix with a positive diagonal that is not positive
    definite, solved with `assume="spd"`: cuDSS's Cholesky breaks down and the
    program says so with the user's line (or, where cuDSS perturbs the pivot,
    the backward error does); never a wrong answer."""
    A = sp.csr_array(np.array([[1.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))
    with pytest.raises((NotPositiveDefiniteError, SingularMatrixError)) as info:
        jax.block_until_ready(sd.function(sd.grad(
            lambda d: snp.sum(sd.linalg.solve(_csr(A, ("spd",))(d), np.ones(3),
                                              solver="cudss") ** 2)))(A.data))
    assert "test_cudss.py" in str(info.value)
    assert _cudss_ffi.KERNELS.live_factors() == 0


def test_no_factor_outlives_its_program(kernels, rng):
    """Repeated calls of programs that make and free factors (a gradient, a
    chain of solves reading one factor) leave none live (`to_jax` under jit:
    its test, whose fixture counts too)."""
    M = _general_csr(rng, 10)
    b = rng.standard_normal(10)
    g = sd.function(sd.grad(lambda d, b: _loss(d, b, M), argnums=(0, 1)))

    def chain(d, y):
        A = _csr(M)(d)
        for _ in range(3):  # (three solves, one factor)
            y = sd.linalg.solve(A, y, solver="cudss")
        return snp.sum(y ** 2)

    h = sd.function(sd.grad(chain))
    for _ in range(5):
        jax.block_until_ready((g(M.data, b), h(M.data, b)))
    assert kernels.live() == 0


def test_the_ledger_sees_a_leaked_factor(rng):
    """The stand-in's count is real: kernels that never free leave one live
    factor per gradient call."""

    class Leaky(_cudss.StandIn):
        def free(self, handle, after=()):
            return jax.numpy.zeros((1,), np.int32)

    M = _general_csr(rng, 6)
    with _cudss.use_kernels(Leaky()) as k:
        g = sd.function(sd.grad(lambda d, b: _loss(d, b, M)))
        for _ in range(2):
            g(M.data, np.ones(6))
        assert k.live() == 2


# ---------------------------------------------------------------------------
# the real FFI only (-m gpu)


@pytest.mark.gpu
@needs_gpu
def test_gpu_concurrent_calls_and_pooled_analysis(rng):
    """Calls from several threads at once give the right values and free
    every factor; the pattern keeps its analysed data objects for the next
    calls (no more than factors were live at once)."""
    k = _cudss_ffi.KERNELS
    M = _general_csr(rng, 200)
    b = rng.standard_normal(200)
    g = jax.jit(jax.grad(sd.to_jax(lambda d, b: _loss(d, b, M)), argnums=1))
    want = np.linalg.solve(M.toarray().T, 2 * np.linalg.solve(M.toarray(), b))
    errors = []

    def work():
        try:
            for _ in range(10):
                np.testing.assert_allclose(np.asarray(g(M.data, b)), want, rtol=1e-8)
        except Exception as e:  # (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert k.live_factors() == 0
    pattern = Pattern(M.shape, M.indptr, M.indices)
    assert 1 <= k.pooled(pattern, None, np.float64) <= 4  # (at most one per thread)


@pytest.mark.gpu
@needs_gpu
def test_gpu_spd_and_batch_values(rng):
    M = _spd_csr(rng, 64)
    bs = rng.standard_normal((8, 64))
    ds = np.stack([M.data * (1 + 0.1 * j) for j in range(8)])
    x = sd.function(sd.vmap(lambda d, b: sd.linalg.solve(_csr(M, ("spd",))(d), b,
                                                         solver="cudss")))(ds, bs)
    for j in range(8):
        np.testing.assert_allclose(np.asarray(x[j]),
                                   np.linalg.solve(M.toarray() * (1 + 0.1 * j), bs[j]),
                                   rtol=1e-9)
    assert _cudss_ffi.KERNELS.live_factors() == 0


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("tags,nrhs", [((), None), ((), 3), (("spd",), None)])
def test_gpu_vmapped_gradient_is_one_uniform_batch(rng, tags, nrhs):
    """A vmapped value and gradient (LU and its transposed solve, or
    Cholesky; one or three right-hand sides) runs in cuDSS's uniform-batch
    mode: right against dense solves per example, no example solved apart
    from its batch, no factor left."""
    k = _cudss_ffi.KERNELS
    M = _spd_csr(rng, 40) if tags else _general_csr(rng, 40)
    rows = np.repeat(np.arange(40), np.diff(M.indptr))
    L = 6
    ds = np.stack([M.data * (1 + 0.05 * j) for j in range(L)])
    bs = rng.standard_normal((L, 40) if nrhs is None else (L, 40, nrhs))

    def loss(d, b):
        return snp.sum(sd.linalg.solve(_csr(M, tags)(d), b, solver="cudss") ** 2)

    fallbacks = k.batch_fallbacks()
    v, g = sd.function(sd.vmap(sd.value_and_grad(loss)))(ds, bs)
    for j in range(L):
        A = M.toarray() * (1 + 0.05 * j)
        x = np.linalg.solve(A, bs[j])
        lam = np.linalg.solve(A.T, 2 * x)
        want = -lam[rows] * x[M.indices] if nrhs is None else \
            -np.sum(lam[rows] * x[M.indices], axis=-1)
        np.testing.assert_allclose(float(v[j]), np.sum(x ** 2), rtol=1e-10)
        np.testing.assert_allclose(np.asarray(g[j]), want, rtol=1e-8, atol=1e-12)
    assert k.batch_status() == (True, "on")
    assert k.batch_fallbacks() == fallbacks
    assert k.live_factors() == 0


@pytest.mark.gpu
@needs_gpu
def test_gpu_auto_lowers_to_cudss(rng):
    """On the GPU, `solver="auto"` picks cuDSS for every sparse matrix (LU,
    Cholesky), `explain_solver` says so, and the compiled program calls
    cuDSS's kernels: right values and gradients, no factor left."""
    k = _cudss_ffi.KERNELS
    for M, tags in ((_general_csr(rng, 30), ()), (_spd_csr(rng, 30), ("spd",))):
        A = _csr(M, tags)(M.data)
        assert "picks 'cudss'" in sd.linalg.explain_solver(A)
        b = rng.standard_normal(30)
        f = sd.to_jax(lambda d, b: snp.sum(sd.linalg.solve(_csr(M, tags)(d), b) ** 2))
        hlo = jax.jit(jax.grad(f, argnums=1)).lower(M.data, b).as_text()
        assert "sciad_cudss_" in hlo and "sciad_klu" not in hlo
        D = M.toarray()
        x = np.linalg.solve(D, b)
        np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(f, argnums=1))(M.data, b)),
                                   np.linalg.solve(D.T, 2 * x), rtol=1e-9)
    assert k.live_factors() == 0


@pytest.mark.gpu
@needs_gpu
def test_gpu_failed_calls_leave_nothing(rng):
    """200 failing value-and-gradient calls (an inf in `b`, found after the
    factorization; a batch with a singular matrix): no factor left, the
    pooled cuDSS data objects bounded, the process's memory flat."""
    k = _cudss_ffi.KERNELS
    M = _general_csr(rng, 200)
    bad = np.where(np.arange(200) == 7, np.inf, 1.0)
    g = sd.function(sd.value_and_grad(lambda d, b: _loss(d, b, M), argnums=(0, 1)))
    good = _P.data.copy()
    good[1] = 2.0
    batch = sd.function(sd.vmap(sd.grad(_p_loss, argnums=(0, 1))))
    ds = np.stack([good, _P.data, good])
    bs = np.ones((3, 4))
    bs[:, 1] = 2.0  # (no solution)

    def fail(n):
        for _ in range(n):
            with pytest.raises(NonFiniteError):
                jax.block_until_ready(g(M.data, bad))
            with pytest.raises(SingularMatrixError):
                jax.block_until_ready(batch(ds, bs))

    fail(20)  # (warm-up: compilation, pools)
    before = rss_mib()
    fail(100)
    grown_mb = rss_mib() - before
    assert k.live_factors() == 0
    assert k.pooled(Pattern(M.shape, M.indptr, M.indices), None, np.float64) <= 2
    assert grown_mb <= 10, grown_mb
