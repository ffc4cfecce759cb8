"""A user primitive with hand-written derivative rules, checked, then used to
fit a model robustly.

The primitive is the pseudo-Huber loss rho(r) = d^2 (sqrt(1 + (r/d)^2) - 1):
quadratic for small residuals, linear for large ones, so outliers pull less.
Its JVP and VJP are written by hand below, `sd.testing.check_rules` checks
them (finite differences, dot-product test, second order), and the fit
minimizes sum(rho(model(theta) - data)) with SciPy's L-BFGS-B on sciad's
compiled value and gradient. Built-in data: a damped oscillation with 10%
gross outliers. Run: `python examples/custom_primitive.py`.
"""

from __future__ import annotations

# (sciad before JAX: it turns on JAX's hoisting of large constants)
import sciad  # noqa: E402, F401, I001
import jax.numpy as jnp
import numpy as np
import scipy.optimize

import sciad as sd
import sciad.numpy as snp

# -- the primitive -----------------------------------------------------------

pseudo_huber_p = sd.primitive("pseudo_huber")


@pseudo_huber_p.def_abstract_eval
def _pseudo_huber_shape(r, *, delta):
    if r.dtype.kind != "f":
        raise sd.errors.DTypeError(f"expects real residuals, got {r.str_short()}.",
                                   op="pseudo_huber")
    return r


@pseudo_huber_p.def_impl
def _pseudo_huber_impl(r, *, delta):
    return delta**2 * (jnp.sqrt(1.0 + (r / delta) ** 2) - 1.0)


def _slope(r, delta):
    # rho'(r) = r / sqrt(1 + (r/d)^2)
    return r / snp.sqrt(1.0 + (r / delta) ** 2)


@pseudo_huber_p.def_jvp
def _pseudo_huber_jvp(primals, tangents, *, delta):
    (r,), (t,) = primals, tangents
    return pseudo_huber_p(r, delta=delta), _slope(r, delta) * t


@pseudo_huber_p.def_vjp
def _pseudo_huber_vjp(primals, out, ct, *, delta):
    (r,) = primals
    return (_slope(r, delta) * ct,)


def pseudo_huber(r, delta=1.0):
    """Elementwise pseudo-Huber loss of residuals `r` with scale `delta`."""
    return pseudo_huber_p(r, delta=float(delta))


# -- the problem ---------------------------------------------------------------

T = np.linspace(0.0, 10.0, 200)
TRUE = np.array([2.0, 0.3, 1.7])  # amplitude, damping, frequency


def model(theta, t):
    a, k, w = theta[0], theta[1], theta[2]
    return a * snp.exp(-k * t) * snp.cos(w * t)


def make_data(seed: int = 0):
    rng = np.random.default_rng(seed)
    clean = TRUE[0] * np.exp(-TRUE[1] * T) * np.cos(TRUE[2] * T)
    data = clean + 0.05 * rng.standard_normal(T.size)
    bad = rng.choice(T.size, T.size // 10, replace=False)
    data[bad] += rng.choice([-1, 1], bad.size) * rng.uniform(1.0, 3.0, bad.size)
    return data


def objective(theta, data, delta=0.1):
    return snp.sum(pseudo_huber(model(theta, T) - data, delta))


def least_squares(theta, data):
    r = model(theta, T) - data
    return 0.5 * snp.sum(r * r)


def fit(loss, data, theta0):
    value_and_grad = sd.function(sd.value_and_grad(loss))

    def fun(theta):
        v, g = value_and_grad(theta, data)
        return float(v), np.asarray(g)

    res = scipy.optimize.minimize(fun, theta0, jac=True, method="L-BFGS-B",
                                  options={"gtol": 1e-10, "maxiter": 500})
    return res


def main():
    rng = np.random.default_rng(1)
    report = sd.testing.check_rules(pseudo_huber_p, rng.standard_normal(50), delta=0.7)
    print(f"check_rules(pseudo_huber): JVP rel. error {report.jvp_error:.1e}, "
          f"dot-product error {report.vjp_error:.1e}, second order "
          f"{report.second_order_error:.1e}")

    data = make_data()
    theta0 = np.array([1.0, 0.1, 1.6])
    rates = sd.testing.taylor_test(lambda th: objective(th, data), theta0,
                                   rng.standard_normal(3))
    print(f"Taylor test of the robust objective: rates {np.round(rates, 3)}")

    robust = fit(objective, data, theta0)
    plain = fit(least_squares, data, theta0)
    print(f"true parameters          {TRUE}")
    print(f"pseudo-Huber fit         {np.round(robust.x, 4)}  ({robust.nit} iterations)")
    print(f"least-squares fit        {np.round(plain.x, 4)}")
    err_r = np.max(np.abs(robust.x - TRUE))
    err_p = np.max(np.abs(plain.x - TRUE))
    print(f"max parameter error: robust {err_r:.3f}, least squares {err_p:.3f}")
    return robust, plain


if __name__ == "__main__":
    main()
