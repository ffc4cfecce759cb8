"""A first look at sciad: trace a discretized PDE step, print its graph, run it
compiled, and check it against NumPy.

The model: 1-D reaction-diffusion u_t = D u_xx + r u (1 - u) on a periodic
grid (Fisher-KPP), explicit Euler in time, central differences in space.
Built-in data: a Gaussian bump. Run: `python examples/quickstart.py`.

One time step is traced and compiled once; the time loop calls the compiled
step. (Unrolling hundreds of steps into one program makes XLA's compile time
grow faster than linearly, with sciad as with plain `jax.jit`; a loop
primitive that keeps one step in the graph is the way to fuse the loop.)
"""

from __future__ import annotations

import time

import numpy as np

import sciad as sd
import sciad.numpy as snp

N, L, D, R = 256, 20.0, 0.5, 1.0
H = L / N
DT = 0.2 * H * H / D  # inside the explicit stability limit
STEPS_PER_CALL = 10


def step(u, dt):
    lap = (snp.roll(u, 1) - 2.0 * u + snp.roll(u, -1)) / (H * H)
    return u + dt * (D * lap + R * u * (1.0 - u))


def advance(u):
    """`STEPS_PER_CALL` steps and the total mass after them."""
    for _ in range(STEPS_PER_CALL):
        u = step(u, DT)
    return u, snp.sum(u) * H


def simulate_numpy(u0, n_steps):
    u = u0.copy()
    for _ in range(n_steps):
        lap = (np.roll(u, 1) - 2.0 * u + np.roll(u, -1)) / (H * H)
        u = u + DT * (D * lap + R * u * (1.0 - u))
    return u, np.sum(u) * H


def main(n_calls: int = 40):
    x = np.linspace(-L / 2, L / 2, N, endpoint=False)
    u0 = np.exp(-x**2)

    print("The graph of one time step:\n")
    print(sd.trace(step, u0, DT))

    run = sd.function(advance)
    t0 = time.perf_counter()
    u, mass = run(u0)
    u.block_until_ready()
    t_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(n_calls - 1):
        u, mass = run(u)
    u.block_until_ready()
    t_steady = (time.perf_counter() - t0) / (n_calls - 1)

    n_steps = n_calls * STEPS_PER_CALL
    u_ref, mass_ref = simulate_numpy(u0, n_steps)
    err = np.max(np.abs(np.asarray(u) - u_ref))
    graph = run.graphs[0]
    print(f"\n{n_steps} steps in {n_calls} calls of a {len(graph.nodes)}-node graph "
          f"(traced {run.trace_count}x): first call {t_first:.2f} s with compilation, "
          f"then {1e6 * t_steady:.0f} us per call")
    print(f"mass {float(mass):.12f} (NumPy {mass_ref:.12f}); dtype {u.dtype}; "
          f"max |sciad - NumPy| = {err:.1e}")
    assert err < 1e-12, "sciad and NumPy disagree"

    back = sd.Graph.from_json(graph.to_json())
    same = str(back) == str(graph)
    print(f"JSON round trip of the graph: {len(graph.to_json()) // 1024} KiB, "
          f"identical text: {same}")


if __name__ == "__main__":
    main()
