"""Ratios of norms that a check may read: NaN where they cannot be measured.

A solve's backward error `||r|| / (||A|| ||x|| + ||b||)` and relative
residual `||r|| / ||b||` are judged with `not eta <= tol` (NaN fails), so
they must never turn a NaN into a passing number. The guarded division
`where(den > 0, num / den, where(num > 0, inf, 0))` did: a singular
`spsolve` returns NaN, `num > 0` is false for NaN, and the backward error of
a NaN solution read 0. `ratio` is that division with NaN carried through,
written once for NumPy, `jax.numpy` and `sciad.numpy` (the `xp` argument).
"""

from __future__ import annotations

import numpy as np


def ratio(num, den, xp=np):
    """`num / den` for norms (`>= 0`, or NaN): `0 / 0 = 0`, `r / 0 = inf`
    for `r > 0`, and NaN where `num` or `den` is NaN.

    ```python
    ratio(np.array([1.0, 0.0, 1.0, np.nan]), np.array([2.0, 0.0, 0.0, 0.0]))
    # array([0.5, 0. , inf, nan])
    ```
    """
    pos = den > 0
    # `num * 0` and `den * 0` are 0 for numbers, NaN for NaN: a measure that
    # cannot be taken stays NaN (and fails `not ratio <= tol`)
    return xp.where(pos, num / xp.where(pos, den, 1.0),
                    xp.where(num > 0, np.inf, num * 0) + den * 0)
