"""Checks shared by test files (imported as `helpers`; no tests here)."""

from __future__ import annotations

import numpy as np

import sciad as sd


def assert_gradient_matches_fd(f, A, d, *, h: float = 1e-5, rtol: float = 1e-7,
                               forward: bool = False):
    """`sd.grad(f)(A)` (a real scalar `f`) is finite and its pairing with the
    direction `d`, `Re sum(g * d)` (sciad's unconjugated pairing), equals the
    central finite difference of `f` along `d` to `rtol`; with `forward`, so
    does `sd.jvp` along `d` (to 1e-9). Returns the gradient."""
    g = np.asarray(sd.grad(f)(A))
    assert np.all(np.isfinite(g))
    along = float(np.real(np.sum(g * d)))
    fd = (float(f(A + h * d)) - float(f(A - h * d))) / (2 * h)
    np.testing.assert_allclose(along, fd, rtol=rtol)
    if forward:
        _, t = sd.jvp(f, (A,), (d,))
        np.testing.assert_allclose(t, along, rtol=1e-9)
    return g
