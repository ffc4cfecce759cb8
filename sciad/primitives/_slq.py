"""A log-determinant estimated without a factorization: stochastic Lanczos
quadrature (SLQ) with Hutchinson probes, for spd matrices too large to factor.

- `linalg.rademacher[shape, seed]() -> int8`: a fixed array of random signs
  (the probes; JAX's counter-based generator, so the same on every run and
  device; integers, so nothing is differentiated through them).
- `linalg.slq_logdet[pattern, steps](a, z) -> logdet`: `log det A = tr log A ~
  (1/p) sum_i z_i^T log(A) z_i` over the `p` columns of `z`, each quadratic
  form by `steps` Lanczos steps from `z_i` (the Gauss quadrature of the
  spectral measure of `A` seen from `z_i`: `|z_i|^2 sum_k tau_k^2 log theta_k`,
  `theta_k` the Ritz values, `tau_k` the first entries of their vectors), in
  the program: one sparse product with a block of `p` vectors a step.

Rule: the JVP is the matching Hutchinson estimator of `tr(A^-1 dA)` with the
same probes, `(1/p) sum_i (A^-1 z_i)^T dA z_i`, its solves by conjugate
gradients (`sd.linalg.solve`, `solver="cg"`, algebraic multigrid as the
preconditioner; up to `SMALL` unknowns, "auto"'s factorization): so the gradient in `A`'s values is `(1/p) sum_i x_i z_i^T`
on the pattern, and, the solve being differentiable, second derivatives are
the matching estimator of `-tr(A^-1 dA A^-1 dB)`. The estimate is unbiased
in the probes (up to the quadrature's error, which falls geometrically with
`steps` at a rate set by the condition number); its standard deviation is
at most `sqrt(2 / p) |log A|_F` (Rademacher probes).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import _ops as ops
from ..errors import (DTypeError, InvalidOptionError, NonFiniteError, NotPositiveDefiniteError,
                      ShapeError)
from ..graph import Param, Primitive, Site, SparseType, TensorType, Zero, instantiate, is_zero
from ..graph._autodiff import type_of
from ..graph._cost import Cost
from ..graph._sparsity import dense
from ..graph._types import Pattern
from ._checks import check, tie
from ._map import map_rule
from ._sparse import gather
from ._util import INTS

#: up to this order the JVP's solves are "auto"'s (a factorization), beyond
#: it AMG-preconditioned conjugate gradients
SMALL = 2000

linalg_rademacher_p = Primitive("linalg.rademacher", params={"shape": INTS, "seed": int})
linalg_slq_logdet_p = Primitive("linalg.slq_logdet", runtime_checks=True, params={
    "pattern": Pattern, "steps": Param(int, default=64)})


@linalg_rademacher_p.def_abstract_eval
def _rademacher_shape(*, shape, seed):
    if any(s < 0 for s in shape):
        raise ShapeError(f"sizes must be non-negative, got {shape}.", op="linalg.rademacher")
    return TensorType(tuple(shape), np.dtype(np.int8))


@linalg_rademacher_p.def_impl
def _rademacher_impl(*, shape, seed):
    key = jax.random.key(np.uint32(seed % 2 ** 32))
    return jax.random.rademacher(key, tuple(shape), dtype=jnp.int8)


linalg_rademacher_p.def_sparsity(lambda outs, **params: dense(outs[0]))
linalg_rademacher_p.def_cost(lambda node, body: Cost(float(np.prod(node.params["shape"]))))


@linalg_slq_logdet_p.def_abstract_eval
def _slq_shape(a, z, *, pattern, steps=64):
    op = "linalg.slq_logdet"
    if not isinstance(a, SparseType) or a.pattern != pattern:
        raise ShapeError(f"expects a sparse matrix on the pattern {pattern}, got "
                         f"{a.str_short()}.", op=op)
    n = pattern.shape[0]
    if pattern.shape[1] != n:
        raise ShapeError(f"expects a square matrix, got shape {pattern.shape}.", op=op)
    if np.dtype(a.dtype).kind != "f":
        raise DTypeError(f"expects a real float matrix, got {np.dtype(a.dtype)}.", op=op)
    if (not isinstance(z, TensorType) or len(z.shape) != 2 or z.shape[0] != n
            or np.dtype(z.dtype).kind not in "iu"):
        raise ShapeError(f"`z` holds the probes' signs, an integer array of shape ({n}, p), "
                         f"got {z.str_short()}.", op=op)
    if steps < 1:
        raise InvalidOptionError(f"`steps` (Lanczos steps per probe) must be >= 1, got "
                                 f"{steps}.", op=op)
    return TensorType((), a.dtype)


def _judge(site: Site, *, nonfinite=False, indefinite=False):
    if np.any(nonfinite):
        site.fail(NonFiniteError, "the matrix holds NaN or infinite values.")
    if np.any(indefinite):
        site.fail(NotPositiveDefiniteError,
                  "a Lanczos quadrature met a Ritz value <= 0: the matrix is not positive "
                  "definite (the estimate needs log of its eigenvalues). Check the matrix, "
                  "or read the log-determinant from a factorization (solver='splu').")


def _lanczos(matvec, z, steps: int):
    """`(alpha, beta)` (each `(steps, p)`) of `steps` Lanczos steps from each
    column of `z`, without reorthogonalization. After an exact breakdown
    (the Krylov space is invariant) a probe's remaining steps are decoupled
    identity rows (`alpha = 1`, `beta = 0`): Ritz values 1 of weight 0."""
    q = z / jnp.linalg.norm(z, axis=0)
    p = z.shape[1]
    zero = jnp.zeros((p,), z.dtype)

    def body(k, carry):
        prev, v, b_prev, done, scale, alpha, beta = carry
        w = matvec(v) - b_prev * prev
        a = jnp.sum(v * w, axis=0)
        w = w - a * v
        b = jnp.linalg.norm(w, axis=0)
        scale = jnp.maximum(scale, jnp.abs(a) + b)  # (about |A|: a breakdown is relative)
        stop = done | ~(b > 1e-13 * scale)
        alpha = alpha.at[k].set(jnp.where(done, 1.0, a))
        beta = beta.at[k].set(jnp.where(stop, 0.0, b))
        nxt = jnp.where(stop, 0.0, w / jnp.where(stop, 1.0, b))
        return v, nxt, jnp.where(stop, 0.0, b), stop, scale, alpha, beta

    init = (jnp.zeros_like(q), q, zero, jnp.zeros((p,), bool), zero,
            jnp.zeros((steps, p), z.dtype), jnp.zeros((steps, p), z.dtype))
    alpha, beta = jax.lax.fori_loop(0, steps, body, init)[-2:]
    return alpha, beta


@linalg_slq_logdet_p.def_impl
def _slq_impl(a, z, *, pattern, steps=64, site=None):
    site = site or Site("linalg.slq_logdet")
    from ._linalg_run import _matvec  # (a solve's product: the pattern's cached indices)

    n = pattern.shape[0]
    zf = z.astype(a.dtype)
    p = zf.shape[1]
    if n == 0 or p == 0:
        return jnp.zeros((), a.dtype)
    alpha, beta = _lanczos(_matvec(a, pattern, False), zf, steps)
    m = steps
    T = (jax.vmap(jnp.diag)(alpha.T) + jax.vmap(lambda b: jnp.diag(b, 1))(beta.T[:, :m - 1])
         + jax.vmap(lambda b: jnp.diag(b, -1))(beta.T[:, :m - 1]))
    theta, U = jnp.linalg.eigh(T)
    weight = U[:, 0, :] ** 2
    # (a Ritz value of weight 0 does not count; one <= 0 that counts means
    # the matrix is not positive definite)
    counts = weight > 1e-14
    indefinite = jnp.any(counts & ~(theta > 0))
    nonfinite = ~jnp.all(jnp.isfinite(a))
    logs = jnp.where(counts, jnp.log(jnp.where(theta > 0, theta, 1.0)), 0.0)
    norms = jnp.sum(zf * zf, axis=0)
    estimate = jnp.mean(norms * jnp.sum(weight * logs, axis=1))
    token = check(_judge, site, when=nonfinite | indefinite, nonfinite=nonfinite,
                  indefinite=indefinite)
    return tie(estimate, token)


@linalg_slq_logdet_p.def_jvp
def _slq_jvp(primals, tangents, *, pattern, steps=64):
    # the matching estimator: (1/p) sum_i (A^-1 z_i)^T dA z_i, the solves by
    # preconditioned conjugate gradients (differentiable: second order too)
    from ._linalg import _clean, linalg_solve_p, solve_params
    from ._sparse import assemble

    (a, z), (da, _) = primals, tangents
    out = linalg_slq_logdet_p.bind(a, z, pattern=pattern, steps=steps)
    if is_zero(da):
        return out, Zero(type_of(out))
    t = type_of(a)
    zf = ops.astype(z, t.dtype)
    # (a matrix small enough to factor cheaply: "auto"'s direct solve, the same x)
    if pattern.shape[0] <= SMALL:
        _, params = solve_params(True, pattern, t.tags | {"spd"}, t.dtype, "auto")
    else:
        _, params = solve_params(True, pattern, t.tags | {"spd"}, t.dtype, "cg",
                                 preconditioner="amg", tol=1e-10)
    x = linalg_solve_p.bind(a, zf, **_clean(params))
    dA = assemble(gather(instantiate(da)), pattern)
    p = type_of(z).shape[1]
    return out, ops.sum(x * (dA @ zf)) / p


linalg_slq_logdet_p.def_batch(map_rule(linalg_slq_logdet_p))
linalg_slq_logdet_p.def_sparsity(lambda outs, a, z, **params: dense(outs[0], a))


@linalg_slq_logdet_p.def_cost
def _slq_cost(node, body):
    p = node.inputs[1].type.shape[1]
    return Cost(2.0 * node.params["pattern"].nnz * p * node.params.get("steps", 64))


def slq_logdet(A, pattern: Pattern, probes: int, steps: int, seed: int):
    """The estimate for the sparse spd matrix `A` (see the module docstring)."""
    z = linalg_rademacher_p.bind(shape=(pattern.shape[0], probes), seed=seed)
    return linalg_slq_logdet_p.bind(A, z, pattern=pattern, steps=steps)
