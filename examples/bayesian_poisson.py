"""The inverse Poisson problem with its uncertainty: a Gaussian prior with a
sparse (Matérn / SPDE) precision, the MAP point, and the Laplace
approximation of the posterior.

The forward model is the flagship's (`inverse_poisson.py`): `-div(exp(m)
grad u) = f_s` on the unit square, 5-point finite volumes on an N x N grid,
four sources; here the solutions are observed at every third node only, with
1% noise. The workflow is hIPPYlib's and R-INLA's:

1. **The prior.** `m ~ N(mu, Q^-1)` with `Q = tau^2 / h^2 (kappa^2 h^2 I + S)^2`,
   `S` the 5-point stiffness matrix: the discretized SPDE `tau^2 (kappa^2 -
   Laplacian)^2` (a Matérn field of smoothness 1, correlation length about
   `sqrt(8) / kappa`, marginal variance about `1 / (4 pi kappa^2 tau^2)`),
   whose precision is sparse (13 entries a row). Its hyperparameters
   `(kappa, tau, mu)` and the noise `s` of 200 direct point measurements of
   `m` are fitted by maximizing the marginal likelihood of that
   linear-Gaussian model, `log p(d) = -1/2 (log det(s^2 I + B Q^-1 B^T) +
   r^T (...)^-1 r) + c`, written with sparse matrices only: `log det P -
   log det Q + K log s^2` with the posterior precision `P = Q + B^T B / s^2`
   (two `sd.linalg.slogdet`s and one solve; L-BFGS on their gradients).
2. **The MAP point** of the PDE problem under that prior: L-BFGS on the data
   misfit plus `1/2 (m - mu)^T Q (m - mu)`.
3. **The Laplace approximation.** The dominant eigenpairs `(lambda_i, w_i)` of
   the prior-preconditioned Gauss-Newton Hessian `H = S^T J^T J S / sigma^2`
   (`S = P^T L^-T`, the prior's square root: `sd.linalg.precision_sample`;
   `J` the Jacobian of the observations at the MAP point) by a randomized
   two-pass method, each pass one batch of Hessian-vector products (a JVP
   and a VJP through the sparse solve, `sd.vmap`ped over the probes). The
   posterior covariance is `S (I - W D W^T) S^T`, `D = lambda / (1 + lambda)`.
4. **Posterior variances and samples.** Pointwise variances: the prior's,
   `diag(Q^-1)` from `sd.linalg.selected_inverse` (no dense inverse), minus
   the low-rank correction `sum_i D_i (S w_i)^2`; samples `m_MAP + S (I - W E
   W^T) z`, `E = 1 - 1 / sqrt(1 + lambda)`.
5. **Dense cross-checks** on a 10 x 10 grid: every piece against NumPy with
   dense matrices (the log-determinants, the selected inverse, the samples'
   covariance, the marginal likelihood, and the posterior variances at full
   rank against `diag((J^T J / sigma^2 + Q)^-1)`).

Run: `python examples/bayesian_poisson.py` (32 x 32 grid, about a minute on
two cores); `--n 48` for a finer grid, `--plot out.png` for the figure
(needs matplotlib: `pip install -e ".[plot]"`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import scipy.sparse as sp

import sciad as sd
import sciad.numpy as snp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from inverse_poisson import Problem, forward  # noqa: E402

POINTS = 200      # direct measurements of m for the hyperparameters
POINT_NOISE = 0.05
STRIDE = 3        # the solutions are observed at every third node
RANK = 80         # eigenpairs kept
OVERSAMPLE = 10


class Prior:
    """The SPDE prior's sparse precision on `problem`'s grid, as a function of
    `(log kappa, log tau)`: `tau^2 / h^2 (kappa^4 h^4 I + 2 kappa^2 h^2 S +
    S^2)`, the three constant matrices stored on one pattern."""

    def __init__(self, problem: Problem):
        n = problem.n
        self.h, self.size = problem.h, n * n
        T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(n, n))
        S = (sp.kron(T, sp.eye(n)) + sp.kron(sp.eye(n), T)).tocsr()
        eye = sp.eye(self.size, format="csr")
        union = (abs(eye) + abs(S) + abs(S @ S)).tocoo()
        self.rows, self.cols = union.row, union.col
        self.parts = [np.asarray(M.tocsr()[self.rows, self.cols]).ravel()
                      for M in (eye, S, S @ S)]
        self.diagonal = np.flatnonzero(self.rows == self.cols)  # (row i's diagonal entry)
        self.diagonal = self.diagonal[np.argsort(self.rows[self.diagonal])]

    def values(self, log_kappa, log_tau):
        k2h2 = snp.exp(2.0 * log_kappa) * self.h ** 2
        c0, c1, c2 = self.parts
        return snp.exp(2.0 * log_tau) / self.h ** 2 * (k2h2 * k2h2 * c0 + 2.0 * k2h2 * c1 + c2)

    def matrix(self, values):
        return sd.sparse.coo_matrix((values, (self.rows, self.cols)),
                                    shape=(self.size, self.size), tags={"spd"})


def neg_log_evidence(theta, prior: Prior, where, d):
    """`-log p(d | theta) - K/2 log(2 pi)` for point measurements `d` of `m` at
    nodes `where` (`theta = (log kappa, log tau, log s, mu)`), with sparse
    matrices only: `Sigma = s^2 I + B Q^-1 B^T` through the posterior
    precision `P = Q + B^T B / s^2` (the determinant lemma and Woodbury)."""
    log_kappa, log_tau, log_s, mu = theta[0], theta[1], theta[2], theta[3]
    q = prior.values(log_kappa, log_tau)
    s2 = snp.exp(2.0 * log_s)
    r = d - mu
    b = snp.zeros(prior.size).at[where].add(r / s2)           # B^T r / s^2
    bump = np.zeros(q.shape[0])
    bump[prior.diagonal[where]] = 1.0
    P = prior.matrix(q + bump / s2)
    logdet_sigma = (sd.linalg.slogdet(P)[1] - sd.linalg.slogdet(prior.matrix(q))[1]
                    + d.size * 2.0 * log_s)
    quad = snp.sum(r * r) / s2 - snp.sum(b * sd.linalg.solve(P, b))
    return 0.5 * (logdet_sigma + quad)


def observe(problem: Problem, u):
    n = problem.n
    grid = snp.reshape(u, (n, n, u.shape[-1]))
    return grid[::STRIDE, ::STRIDE]


def objective(m, prior_q, mu, data, sigma, problem: Problem):
    """Data misfit plus the prior's `1/2 (m - mu)^T Q (m - mu)`."""
    r = (observe(problem, forward(problem, m)) - data) / sigma
    dm = m - mu
    return 0.5 * snp.sum(r * r) + 0.5 * snp.sum(dm * (prior_q @ dm))


def hessian_batch(problem: Problem, Q, m_map, sigma):
    """`V -> H V` for the prior-preconditioned Gauss-Newton Hessian at the MAP
    point, `H = S^T J^T J S / sigma^2`, over the columns of `V` (one compiled
    call: a JVP and a VJP through the solve for every column)."""
    def G(z):  # the observations of m_MAP + S z
        return observe(problem, forward(problem, m_map + sd.linalg.precision_sample(Q, z)))

    z0 = np.zeros(problem.n * problem.n)

    def apply(v):
        _, jv = sd.jvp(G, (z0,), (v,))
        _, pull = sd.vjp(G, z0)
        return pull(jv)[0] / sigma ** 2

    return sd.function(sd.vmap(apply, in_axes=1, out_axes=1))


def randomized_eigh(apply, size: int, rank: int, oversample: int, seed: int = 0):
    """The `rank` largest eigenpairs of the symmetric positive semidefinite
    operator `apply` (on blocks), by two passes (Halko, Martinsson and Tropp)."""
    omega = np.random.default_rng(seed).standard_normal((size, min(size, rank + oversample)))
    basis, _ = np.linalg.qr(np.asarray(apply(omega)))
    small = basis.T @ np.asarray(apply(basis))
    lam, U = np.linalg.eigh(0.5 * (small + small.T))
    order = np.argsort(lam)[::-1][:rank]
    return lam[order], basis @ U[:, order]


def laplace(problem, Q, m_map, sigma, rank, oversample=OVERSAMPLE, samples=3, seed=0):
    """The posterior's pointwise standard deviation, a few samples, the prior's
    standard deviation and the spectrum."""
    lam, W = randomized_eigh(hessian_batch(problem, Q, m_map, sigma), problem.n ** 2, rank,
                             oversample, seed)
    lam = np.maximum(lam, 0.0)
    prior_var = np.asarray(sd.sparse.todense(sd.linalg.selected_inverse(Q)).diagonal())
    SW = np.asarray(sd.linalg.precision_sample(Q, W))
    post_var = prior_var - (SW ** 2) @ (lam / (1.0 + lam))
    z = np.random.default_rng(seed + 1).standard_normal((problem.n ** 2, samples))
    shrink = 1.0 - 1.0 / np.sqrt(1.0 + lam)
    draws = m_map[:, None] + np.asarray(
        sd.linalg.precision_sample(Q, z - W @ (shrink[:, None] * (W.T @ z))))
    return np.sqrt(post_var), draws, np.sqrt(prior_var), lam


def fit_hyperparameters(problem: Problem, prior: Prior, m_true, say):
    rng = np.random.default_rng(3)
    count = min(POINTS, problem.n ** 2 // 4)
    where = np.sort(rng.choice(problem.n ** 2, count, replace=False))
    d = m_true[where] + POINT_NOISE * rng.standard_normal(count)
    f = lambda th: neg_log_evidence(th, prior, where, d)  # noqa: E731
    theta0 = np.array([np.log(10.0), np.log(0.05), np.log(0.2), 0.0])
    rates = sd.testing.taylor_test(f, theta0, np.array([0.3, -0.2, 0.1, 0.05]))
    say(f"marginal likelihood: Taylor test (rates, want ~2) {np.array2string(rates, precision=3)}")
    res = sd.optimize.minimize(f, theta0, method="L-BFGS-B")
    kappa, tau, s, mu = np.exp(res.x[0]), np.exp(res.x[1]), np.exp(res.x[2]), res.x[3]
    say(f"  fitted by {res.nit} L-BFGS iterations: kappa {kappa:.2f} (correlation length "
        f"{np.sqrt(8) / kappa:.3f}), prior std {1 / np.sqrt(4 * np.pi) / kappa / tau:.3f}, "
        f"mean {mu:.3f}, point noise {s:.3f} (true {POINT_NOISE})")
    return res.x, where, rates


def make_data(problem: Problem, seed: int = 0):
    """The observed solutions for the true field, plus 1% noise."""
    u = np.asarray(sd.function(lambda m: observe(problem, forward(problem, m)))(
        problem.true_field()))
    sigma = 0.01 * float(np.max(np.abs(u)))
    return u + sigma * np.random.default_rng(seed).standard_normal(u.shape), sigma


def dense_checks(n: int = 10, say=print) -> dict:
    """Every piece against dense NumPy on an `n` x `n` grid: the largest
    relative (or, for values near zero, absolute) discrepancy of each."""
    problem = Problem(n)
    prior = Prior(problem)
    N = n * n
    theta = np.array([np.log(8.0), np.log(0.06), np.log(0.1), 0.1])
    q = np.asarray(sd.function(prior.values)(theta[0], theta[1]))
    Q = prior.matrix(q)
    Qd = sp.csr_matrix((q, (prior.rows, prior.cols)), shape=(N, N)).toarray()
    inv = np.linalg.inv(Qd)
    out = {}
    out["slogdet"] = abs(float(sd.linalg.slogdet(Q)[1]) - np.linalg.slogdet(Qd)[1]) / abs(
        np.linalg.slogdet(Qd)[1])
    Z = np.asarray(sd.sparse.todense(sd.linalg.selected_inverse(Q)))
    on = Qd != 0
    out["selected inverse"] = np.abs(Z - inv)[on].max() / np.abs(inv).max()
    X = np.asarray(sd.linalg.precision_sample(Q, np.eye(N)))
    out["samples' covariance"] = np.abs(X @ X.T - inv).max() / np.abs(inv).max()
    # the marginal likelihood, against Sigma = s^2 I + B Q^-1 B^T formed densely
    rng = np.random.default_rng(5)
    where = np.sort(rng.choice(N, 12, replace=False))
    d = rng.standard_normal(12)
    ours = float(sd.function(lambda th: neg_log_evidence(th, prior, where, d))(theta))
    sigma_d = np.exp(2 * theta[2]) * np.eye(12) + inv[np.ix_(where, where)]
    r = d - theta[3]
    dense = 0.5 * (np.linalg.slogdet(sigma_d)[1] + r @ np.linalg.solve(sigma_d, r))
    out["marginal likelihood"] = abs(ours - dense) / abs(dense)
    # the Laplace variances at full rank against the dense posterior covariance
    data, sigma = make_data(problem)
    m_map = 0.3 * np.sin(np.arange(N))
    obs = lambda m: observe(problem, forward(problem, m)).ravel()  # noqa: E731
    J = np.asarray(sd.jacfwd(obs)(m_map))
    post = np.linalg.inv(J.T @ J / sigma ** 2 + Qd)
    std, _, prior_std, lam = laplace(problem, Q, m_map, sigma, rank=N, oversample=0)
    out["posterior std (full rank)"] = np.abs(std - np.sqrt(np.diag(post))).max() / np.sqrt(
        np.diag(post)).max()
    out["prior std"] = np.abs(prior_std - np.sqrt(np.diag(inv))).max() / np.sqrt(
        np.diag(inv)).max()
    for name, err in out.items():
        say(f"  dense check, {name}: {err:.1e}")
    return out


def main(n: int = 32, plot: str | None = None, verbose: bool = True, rank: int = RANK,
         maxiter: int = 300, checks: bool = True):
    say = print if verbose else (lambda *a, **k: None)
    t0 = time.perf_counter()
    if checks:
        say("dense cross-checks on a 10 x 10 grid (relative discrepancies):")
        checks = dense_checks(10, say)
    problem = Problem(n)
    prior = Prior(problem)
    m_true = problem.true_field()
    say(f"Bayesian inverse Poisson: {n} x {n} grid ({n * n} unknowns); prior precision "
        f"{prior.rows.size} stored entries")
    theta, where, evidence_rates = fit_hyperparameters(problem, prior, m_true, say)
    q = np.asarray(sd.function(prior.values)(theta[0], theta[1]))
    Q = prior.matrix(q)
    data, sigma = make_data(problem)
    f = lambda m: objective(m, Q, theta[3], data, sigma, problem)  # noqa: E731
    m0 = np.full(n * n, theta[3])
    rates = sd.testing.taylor_test(f, m0 + 0.1, np.random.default_rng(1).standard_normal(n * n))
    say(f"MAP objective: Taylor test {np.array2string(rates, precision=3)}; "
        f"{data.size} observations")
    res = sd.optimize.minimize(f, m0, method="L-BFGS-B", options={"maxiter": maxiter})
    m_map = res.x
    err = np.linalg.norm(m_map - m_true) / np.linalg.norm(m_true)
    say(f"  MAP by {res.nit} L-BFGS iterations: relative error {err:.3f}")
    std, draws, prior_std, lam = laplace(problem, Q, m_map, sigma, rank)
    inside = np.mean(np.abs(m_map - m_true) <= 2.0 * std)
    say(f"Laplace: {rank} eigenpairs of the prior-preconditioned Gauss-Newton Hessian, "
        f"lambda from {lam[0]:.3g} to {lam[-1]:.3g}")
    say(f"  pointwise std: prior {prior_std.mean():.3f}, posterior {std.mean():.3f} on average "
        f"(min {std.min():.3f}, max {std.max():.3f}); |m_MAP - m_true| <= 2 std at "
        f"{100 * inside:.0f}% of the nodes")
    say(f"done in {time.perf_counter() - t0:.1f} s")
    if plot:
        if _plot(problem, m_true, m_map, std, draws, lam, plot):
            say(f"figure written to {plot}")
    return dict(checks=checks, theta=theta, evidence_rates=evidence_rates, rates=rates,
                m_map=m_map, m_true=m_true, std=std, prior_std=prior_std, draws=draws,
                lam=lam, inside=inside)


def _plot(problem: Problem, m_true, m_map, std, draws, lam, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[plot]'): no figure.")
        return False
    n = problem.n
    fig, axes = plt.subplots(2, 3, figsize=(13, 8))
    lo, hi = float(np.min(m_true)), float(np.max(m_true))
    panels = [(m_true, "true log-conductivity"), (m_map, "MAP point"),
              (draws[:, 0], "a posterior sample"), (draws[:, 1], "another sample")]
    for ax, (field, title) in zip(axes.ravel()[[0, 1, 3, 4]], panels):
        im = ax.imshow(field.reshape(n, n), origin="lower", extent=(0, 1, 0, 1), vmin=lo,
                       vmax=hi, cmap="viridis")
        ax.set_title(title)
        fig.colorbar(im, ax=ax, shrink=0.8)
    ax = axes[0, 2]
    im = ax.imshow(std.reshape(n, n), origin="lower", extent=(0, 1, 0, 1), cmap="magma")
    x = (np.arange(n) + 1) * problem.h
    X, Y = np.meshgrid(x[::STRIDE], x[::STRIDE])
    ax.plot(X.ravel(), Y.ravel(), ".", color="white", markersize=2)
    ax.set_title("posterior std (dots: observed nodes)")
    fig.colorbar(im, ax=ax, shrink=0.8)
    ax = axes[1, 2]
    ax.semilogy(np.arange(1, lam.size + 1), lam, "o-", markersize=3)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xlabel("i")
    ax.set_title("eigenvalues of the prior-preconditioned\nGauss-Newton Hessian")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=32, help="grid size per side (default 32)")
    p.add_argument("--rank", type=int, default=RANK, help="eigenpairs kept (default 40)")
    p.add_argument("--plot", default="examples/bayesian_poisson.png",
                   help="where to write the figure ('' for none)")
    args = p.parse_args()
    main(args.n, args.plot or None, rank=args.rank)
