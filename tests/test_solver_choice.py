"""What `solver="auto"` picks, and `sd.linalg.explain_solver`, which says why.

On the CPU the choice is the measured one (KLU for sparse matrices up to
12,000 unknowns, CHOLMOD for larger spd ones where installed, SuperLU
above; LU / Cholesky for dense ones). Where the program runs on an
accelerator (`jax.default_backend()` patched here: the GPU itself is tested
by `pytest -m gpu` in test_cudss.py), "auto" follows the device: cuDSS for
a sparse matrix where the extra is installed (its host stand-in here), else
a Krylov solve in the program (CG with algebraic multigrid for an spd
matrix, GMRES otherwise); never a factorization on the host.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import scipy.sparse as sp

import sciad as sd
import sciad.numpy as snp
from sciad import solvers
from sciad.solvers.direct import _cudss, _cudss_ffi, _klu_ffi
from sciad.solvers import _linear
from sciad.solvers.direct._cholmod_ffi import CompiledCholmod
from sciad.solvers._linear import choose

F64 = np.dtype(np.float64)


def _lap(n, spd=True):
    M = sp.diags([-1.0, 2.5 if spd else 2.0, -1.0 if spd else -0.5], [-1, 0, 1], (n, n))
    return sd.sparse.from_scipy(sp.csr_array(M), tags={"spd"} if spd else ())


def _solver_of(A):
    """The solver of the graph's solve node, as printed."""
    g = sd.trace(lambda d: sd.linalg.solve(sd.sparse.with_data(A, d), np.ones(A.shape[0])),
                 np.asarray(A.data))
    [node] = [n for n in g.nodes if n.primitive.name == "linalg.solve"]
    return node.params["solver"], node.params.get("preconditioner")


@pytest.mark.skipif(not _klu_ffi.available(), reason="klujax is not installed")
def test_on_the_cpu_the_measured_choice():
    assert jax.default_backend() == "cpu"
    assert _solver_of(_lap(50)) == ("klu", None)
    assert _solver_of(_lap(50, spd=False)) == ("klu", None)
    assert choose(matrix="dense", tags=frozenset(), dtype=F64).name == "lu"
    assert choose(matrix="dense", tags=frozenset({"spd"}), dtype=F64).name == "cholesky"
    assert choose(matrix="operator", tags=frozenset({"spd"}), dtype=F64).name == "cg"
    text = sd.linalg.explain_solver(_lap(50, spd=False))
    assert text.startswith("solver=\"auto\" picks 'klu' for a sparse float64[50, 50] matrix "
                           "(nnz=148), the program running on the cpu:")
    assert "'klu'       preference 2     picked" in text
    assert "'cudss'" in text and "not taken: solver 'cudss' is not available here" in text
    assert "'lu'" not in text  # (a dense solver: not listed for a sparse matrix)


@pytest.fixture
def on_a_gpu(monkeypatch):
    """The program runs on an NVIDIA GPU (JAX's default backend patched;
    nothing runs there)."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(_cudss_ffi, "gpu_backend", lambda: True)


@pytest.mark.skipif(not _klu_ffi.available(), reason="the stand-in needs klujax")
def test_on_a_gpu_with_cudss_auto_picks_cudss(on_a_gpu):
    with _cudss.use_kernels(_cudss.StandIn()):
        for A in (_lap(50), _lap(50, spd=False), _lap(20_000)):
            assert _solver_of(A) == ("cudss", None)
        assert "picks 'cudss'" in sd.linalg.explain_solver(_lap(50))


class _Missing(_klu_ffi.KLUKernels):
    def unavailable(self):
        return "the [cuda] extra is not installed"


def test_on_a_gpu_without_cudss_auto_stays_on_the_device(on_a_gpu):
    """Never SuperLU or CHOLMOD on the host: CG with AMG for an spd matrix,
    GMRES for another; dense solves stay LU / Cholesky (in the program)."""
    with _cudss.use_kernels(_Missing()):
        assert _solver_of(_lap(50)) == ("cg", "amg")
        assert _solver_of(_lap(50, spd=False)) == ("gmres", None)
        text = sd.linalg.explain_solver(_lap(50))
        assert "picks 'cg'" in text and "the program running on the gpu" in text
        assert ("'splu'      preference 1     not taken: it runs on the host, and the program "
                "on the gpu: ask for it by name to factor there") in text
        assert choose(matrix="dense", tags=frozenset(), dtype=F64).name == "lu"
        # named, a host solver is still taken
        g = sd.trace(lambda d: sd.linalg.solve(sd.sparse.with_data(_lap(5), d), np.ones(5),
                                               solver="splu"), np.ones(13))
        assert any(n.params.get("solver") == "splu" for n in g.nodes)


def test_on_a_gpu_the_device_path_solves(on_a_gpu):
    """The device path's value and gradient (run here on the CPU) match a
    dense solve to the Krylov tolerance."""
    n = 40
    A = _lap(n)
    with _cudss.use_kernels(_Missing()):
        f = sd.function(sd.value_and_grad(
            lambda d: snp.sum(sd.linalg.solve(sd.sparse.with_data(A, d), np.ones(n)) ** 2)))
        assert "solver='cg'" in str(f.trace(np.asarray(A.data)))
        val, grad = f(np.asarray(A.data))  # (the program itself runs on the CPU)
    M = np.asarray(sd.sparse.todense(A))
    x = np.linalg.solve(M, np.ones(n))
    np.testing.assert_allclose(float(val), float(x @ x), rtol=1e-8)
    # d(x.x)/dA_ij = -2 lam_i x_j with A^T lam = x, on the pattern
    lam = np.linalg.solve(M.T, x)
    want = -2 * lam[A.type.pattern.rows] * x[A.type.pattern.indices]
    np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-7, atol=1e-12)


def test_explain_solver_refuses_a_bad_assume():
    with pytest.raises(sd.errors.InvalidOptionError, match="`assume` must be one of"):
        sd.linalg.explain_solver(np.eye(3), assume="diagonal")


def test_on_a_gpu_cholmod_says_it_runs_on_the_cpu(on_a_gpu):
    if not isinstance(solvers.lookup("cholmod"), CompiledCholmod):
        pytest.skip("sparsax is not installed")
    A = _lap(50)
    with pytest.raises(sd.errors.InvalidOptionError, match="'cholmod' runs on the CPU only.*'gpu'"):
        sd.trace(lambda d: sd.linalg.solve(sd.sparse.with_data(A, d), np.ones(50),
                                           solver="cholmod"), np.asarray(A.data))
    assert "'cholmod'" in sd.linalg.explain_solver(A) and "runs on the CPU only" in \
        sd.linalg.explain_solver(A)
