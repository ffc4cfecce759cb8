"""Distributed Krylov: `sd.linalg.solve(A, b, solver="cg"|"gmres",
partition=P)` runs the solver's loop on vectors split over the devices as
the rows of `A`, its products the sharded ones (halo exchange only), its
inner products local dots and all-reduces; the implicit adjoint's
transposed solve and sampled product are sharded too.

XLA's device count is fixed when JAX starts, so the runs on 4 simulated
devices happen in one child process (`_CHILD`) that prints its findings as
JSON (as in tests/test_sparse_sharded.py); the tests read them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.sparse as sp

import sciad as sd
import sciad.numpy as snp
from sciad.errors import InvalidOptionError, ShapeError, StructureError

N = 16                       # a 16 x 16 grid: 256 unknowns, 64 rows per device
n = N * N
_rng = np.random.default_rng(0)
# conductivities on the grid's faces: kx[i, j] between cells (i, j-1) and
# (i, j), ky[i, j] between (i-1, j) and (i, j) (the outer ones: the boundary)
_k = (_rng.uniform(0.5, 1.5, (N, N + 1)), _rng.uniform(0.5, 1.5, (N + 1, N)))


def _poisson(k, convection: float = 0.0):
    """The 5-point `-div(k grad u)` on the N x N grid (Dirichlet), with
    conductivities `k` on the faces, plus a first-order upwind convection
    along x (nonsymmetric where `convection` is not 0)."""
    kx, ky = k
    idx = np.arange(n).reshape(N, N)       # idx[i, j]: row i (y), column j (x)
    rows, cols, vals = [], [], []
    diag = np.zeros((N, N))
    for (di, dj), w in (((0, 1), kx[:, 1:]), ((0, -1), kx[:, :-1]),
                        ((1, 0), ky[1:]), ((-1, 0), ky[:-1])):
        diag += w
        i, j = np.meshgrid(np.arange(N), np.arange(N), indexing="ij")
        ii, jj = i + di, j + dj
        inside = (ii >= 0) & (ii < N) & (jj >= 0) & (jj < N)
        c = convection if (di, dj) == (0, -1) else 0.0
        rows.append(idx[inside])
        cols.append(idx[ii[inside], jj[inside]])
        vals.append(-w[inside] - c)
        if c:
            diag += c
    rows.append(idx.ravel())
    cols.append(idx.ravel())
    vals.append(diag.ravel())
    A = sp.coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                      shape=(n, n)).tocsr()
    A.sort_indices()
    return A


SPD = _poisson(_k)
NONSYM = _poisson(_k, convection=0.8)
assert (SPD.indices == NONSYM.indices).all() and (SPD.indptr == NONSYM.indptr).all()
pat = sd.sparse.from_scipy(SPD).type.pattern
b = _rng.standard_normal(n)
w = _rng.standard_normal(n)
DATA = {"cg": SPD.data, "gmres": NONSYM.data, "bicgstab": NONSYM.data}
# conductivities over four orders of magnitude: a diagonal that Jacobi evens out
ROUGH = _poisson(tuple(np.exp(_rng.uniform(-4.6, 4.6, k.shape)) for k in _k))


def steps(d, b, preconditioner, part):
    """The iterations of the sharded CG solve (from the solver's machinery:
    the solve reports them only when it fails)."""
    import jax
    from sciad.primitives._sparse_sharded import block_amg, sharded_product
    from sciad.solvers.iterative import _iterative as iterative

    def run(d, b):
        matvec, b, split, _ = sharded_product(part, d, b, False, op="test")
        pre = None
        if preconditioner == "jacobi":
            inv = split(1.0 / d[pat.diagonal_positions()])
            pre = lambda v: inv * v  # noqa: E731
        elif preconditioner == "block_amg":
            pre = block_amg(part, d, b, False, op="test")
        return iterative.solve(matvec, b, method="cg", rtol=1e-10, atol=0.0, maxiter=None,
                               precond=pre)[3]
    return int(jax.jit(run)(d, b))


def solve(d, b, solver, part, **kw):
    A = sd.sparse.csr_matrix((d, pat.indices, pat.indptr), shape=(n, n))
    return sd.linalg.solve(A, b, solver=solver, partition=part, tol=1e-12,
                           assume="spd" if solver == "cg" else None, **kw)


def loss(d, b, solver, part, **kw):
    return snp.sum(w * solve(d, b, solver, part, **kw))


_CHILD = textwrap.dedent(r'''
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax
    from jax.sharding import AxisType, PartitionSpec as P
    import numpy as np
    import sciad as sd, sciad.numpy as snp
    sys.path.insert(0, os.environ["SCIAD_TESTS_DIR"])
    from test_sharded_krylov import DATA, ROUGH, b, collectives, loss, n, pat, solve, steps

    part = sd.sparse.row_partition(pat, 4, "rows")
    mesh = jax.make_mesh((4,), ("rows",), axis_types=(AxisType.Auto,))
    out = {"received": part.received(), "exchange": part.exchange}
    for solver in [s for s in os.environ["SOLVERS"].split(",") if s in DATA]:
        d = DATA[solver]
        r = out[solver] = {}
        fwd = lambda part: sd.function(lambda d, b: solve(d, b, solver, part))
        vg = lambda part: sd.function(sd.value_and_grad(
            lambda d, b: loss(d, b, solver, part), argnums=(0, 1)))
        want_x = np.asarray(fwd(None)(d, b))
        want_v, (want_gd, want_gb) = vg(None)(d, b)
        with jax.set_mesh(mesh):
            f, g = fwd(part), vg(part)
            x = f(d, b)
            v, (gd, gb) = g(d, b)
            r["spec"] = str(x.sharding.spec)
            r["err"] = [float(np.abs(np.asarray(x) - want_x).max() / np.abs(want_x).max()),
                        float(abs(v - want_v) / abs(want_v)),
                        float(np.abs(np.asarray(gd) - want_gd).max() / np.abs(want_gd).max()),
                        float(np.abs(np.asarray(gb) - want_gb).max() / np.abs(want_gb).max())]
            r["hlo"] = collectives(f.lower(d, b).compile().as_text())
            r["hlo_grad"] = collectives(g.lower(d, b).compile().as_text())
    if os.environ["SOLVERS"] == "preconditioned":
        # Jacobi per device (its rows' diagonal), and block-Jacobi with a
        # local AMG V-cycle per device (two levels: coarsest of at most 16)
        from sciad.solvers.iterative import _amg
        _amg.MAX_COARSE = 16
        d = ROUGH.data
        f = lambda part, pre: sd.function(sd.value_and_grad(
            lambda d, b: loss(d, b, "cg", part, preconditioner=pre), argnums=(0, 1)))
        want_v, (want_gd, want_gb) = f(None, None)(d, b)
        with jax.set_mesh(mesh):
            for pre in ("jacobi", "block_amg"):
                r = out[pre] = {}
                g = f(part, pre)
                v, (gd, gb) = g(d, b)
                r["err"] = [
                    float(abs(v - want_v) / abs(want_v)),
                    float(np.abs(np.asarray(gd) - want_gd).max() / np.abs(want_gd).max()),
                    float(np.abs(np.asarray(gb) - want_gb).max() / np.abs(want_gb).max())]
                r["hlo_grad"] = collectives(g.lower(d, b).compile().as_text())
                # new values: one hierarchy per block, made by its device
                # (one host call for every block ran on every device: 16)
                before = _amg.setup_count()
                g(d * 1.01, b)
                r["setups"] = _amg.setup_count() - before
            out["steps"] = [steps(d, b, pre, part) for pre in (None, "jacobi", "block_amg")]
            # several right-hand sides by sd.vmap: each a sharded solve
            d = DATA["cg"]
            B = np.stack([b, -2.0 * b, b[::-1]])
            X = sd.function(sd.vmap(lambda b: solve(d, b, "cg", part)))(B)
        want = sd.function(sd.vmap(lambda b: solve(d, b, "cg", None)))(B)
        out["vmap_err"] = float(np.abs(np.asarray(X) - np.asarray(want)).max())
    if os.environ["SOLVERS"] != "cg":
        print("RESULT " + json.dumps(out))
        sys.exit(0)
    with jax.set_mesh(mesh):
        d = DATA["cg"]
        # failures, through the derivative and through to_jax under jit
        errs = out["errors"] = {}
        runs = {
            "grad": lambda: sd.function(sd.grad(
                lambda d, b: loss(d, b, "cg", part, maxiter=2)))(d, b),
            "to_jax": lambda: jax.jit(sd.to_jax(sd.value_and_grad(
                lambda d, b: loss(d, b, "cg", part, maxiter=2))))(d, b),
            "nan": lambda: sd.function(lambda d, b: solve(d, b, "cg", part))(
                d, np.where(np.arange(n) == 5, np.nan, b)),
        }
        for name, run in runs.items():
            try:
                jax.block_until_ready(run())
                errs[name] = None
            except Exception as e:
                e = sd.errors.runtime_error_from(e) or e
                errs[name] = [type(e).__name__, str(e)]
        # a partition for another device count than the mesh's
        try:
            sd.function(lambda d, b: solve(d, b, "cg", sd.sparse.row_partition(pat, 2, "rows")))(
                d, b)
        except Exception as e:
            out["wrong_devices"] = [type(e).__name__, str(e)]
    # a mesh with explicit axes: refused, naming the fix
    with jax.set_mesh(jax.make_mesh((4,), ("rows",), axis_types=(AxisType.Explicit,))):
        try:
            sd.function(lambda d, b: solve(d, b, "cg", part))(d, b)
        except Exception as e:
            out["explicit"] = [type(e).__name__, str(e)]
    print("RESULT " + json.dumps(out))
''')

_COLLECTIVES = ("all-gather(", "all-reduce(", "collective-permute(", "all-to-all(",
                "reduce-scatter(", "all-gather-start(", "all-reduce-start(",
                "collective-permute-start(")


def collectives(hlo: str) -> dict:
    """The collectives of a compiled program's text, as `"shape op"`
    strings: those anywhere (`"all"`) and those in the bodies of its while
    loops and the computations they call (`"loop"`)."""
    comps, name = {}, None
    for line in hlo.splitlines():
        s = line.strip()
        if s.endswith("{") and "=" not in s.split("(")[0]:
            name = (s.split()[1] if s.startswith("ENTRY") else s.split()[0]).lstrip("%")
            comps[name] = []
        elif name is not None and s and s != "}":
            comps[name].append(s)

    def found(lines):
        return sorted(ln.split("=", 1)[1].split()[0] + " " + c.rstrip("(").split("-start")[0]
                      for ln in lines for c in _COLLECTIVES if c in ln)

    def called(comp, seen):
        for ln in comps.get(comp, []):
            for key in ("body=", "condition=", "calls=", "true_computation=",
                        "false_computation=", "branch_computations={"):
                if key in ln:
                    for c in ln.split(key, 1)[1].split("}")[0].split(",")[:8]:
                        c = c.strip().lstrip("{%").split(" ")[0].rstrip(")")
                        if c in comps and c not in seen:
                            seen.add(c)
                            called(c, seen)
        return seen

    bodies = set()
    for lines in comps.values():
        for ln in lines:
            if " while(" in ln and "body=" in ln:
                body = ln.split("body=", 1)[1].split(",")[0].split()[0].lstrip("%")
                bodies |= {body} | called(body, set())
    return {"all": found(ln for lines in comps.values() for ln in lines),
            "loop": found(ln for c in bodies for ln in comps.get(c, []))}


def _run_child(solvers: str) -> dict:
    env = dict(os.environ, SCIAD_TESTS_DIR=os.path.dirname(os.path.abspath(__file__)),
               SOLVERS=solvers)
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                          timeout=300, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def child():
    """CG: values, gradients, the compiled collectives, failures, a batch."""
    return _run_child("cg")


@pytest.fixture(scope="module")
def child_gmres():
    """GMRES and BiCGStab (nonsymmetric: the adjoint is the transposed
    sharded solve)."""
    return _run_child("gmres,bicgstab")


@pytest.fixture(scope="module")
def child_preconditioned():
    """CG preconditioned per device: Jacobi, block-Jacobi with local AMG."""
    return _run_child("preconditioned")


@pytest.fixture
def solved(request, child):
    if request.param == "cg":
        return child["received"], child["exchange"], child["cg"]
    r = request.getfixturevalue("child_gmres" if request.param in ("gmres", "bicgstab")
                                else "child_preconditioned")
    return r["received"], r["exchange"], r[request.param]


SOLVERS = ["cg", pytest.param("gmres", marks=pytest.mark.slow),
           pytest.param("bicgstab", marks=pytest.mark.slow)]


@pytest.mark.parametrize("solved", SOLVERS, indirect=True)
def test_sharded_solve_and_gradient_equal_one_device(solved):
    _, _, r = solved
    assert r["spec"] == "P('rows',)"
    x_err, v_err, gd_err, gb_err = r["err"]
    assert x_err < 1e-11 and v_err < 1e-11 and gd_err < 1e-10 and gb_err < 1e-10


@pytest.mark.parametrize("solved,program", [
    ("cg", "hlo"), ("cg", "hlo_grad"),
    pytest.param("gmres", "hlo", marks=pytest.mark.slow),
    pytest.param("gmres", "hlo_grad", marks=pytest.mark.slow),
    pytest.param("bicgstab", "hlo_grad", marks=pytest.mark.slow),
    pytest.param("jacobi", "hlo_grad", marks=pytest.mark.slow),
    pytest.param("block_amg", "hlo_grad", marks=pytest.mark.slow)], indirect=["solved"])
def test_the_loop_moves_the_halo_and_scalars_only(solved, program):
    # 64 rows per device, one grid row (16 values) from each neighbour: the
    # loop's collectives are the halo's two collective-permutes of 16 values
    # per product and all-reduces of scalars (GMRES: of one vector of
    # Gram-Schmidt coefficients); no vector is gathered, in the loop or out
    received, exchange, r = solved
    assert received == 32 and exchange == "ppermute"
    hlo = r[program]
    loop = hlo["loop"]
    assert loop and not any("all-gather" in c or "all-to-all" in c for c in hlo["all"])
    for c in loop:
        shape, op = c.split(" ")
        if op == "collective-permute":
            assert shape == "f64[16]{0}", c
        else:
            assert op == "all-reduce", c
            # a scalar, a tuple of scalars, or GMRES's restart+1 coefficients
            assert shape in ("f64[]", "pred[]", "s32[]") or shape.startswith("(") \
                or shape == "f64[21]{0}", c
    for c in hlo["all"]:   # outside the loops too: no vector of n values moves
        assert f"[{n}]" not in c and "[1024]" not in c, c


@pytest.mark.parametrize("run", ["grad", "to_jax"])
def test_non_convergence_raises_through_grad_and_to_jax(child, run):
    # (the check runs on every device, so that all stop: on one, the others
    # would wait in the loop's next all-reduce)
    name, msg = child["errors"][run]
    assert name == "ConvergenceError" and "cg did not converge" in msg
    assert "after 2 iterations" in msg and "test_sharded_krylov.py" in msg


def test_nan_right_hand_side_raises(child):
    name, msg = child["errors"]["nan"]
    assert name == "NonFiniteError" and "right-hand side" in msg


@pytest.mark.slow
def test_preconditioners_per_device_cut_iterations_and_equal_one_device(child_preconditioned):
    r = child_preconditioned
    assert max(r["jacobi"]["err"]) < 1e-10 and max(r["block_amg"]["err"]) < 1e-10
    assert r["block_amg"]["setups"] == 4  # (a value and gradient: 4 blocks, each set up once)
    assert r["jacobi"]["setups"] == 0
    plain, jacobi, amg = r["steps"]
    assert jacobi < 0.7 * plain and amg < 0.7 * jacobi, r["steps"]


def test_jacobi_with_a_partition_without_a_mesh_is_the_one_device_solve():
    part = sd.sparse.row_partition(pat, 4, "rows")
    f = sd.function(lambda d, b, p: solve(d, b, "cg", p, preconditioner="jacobi"),
                    static_argnums=2)
    np.testing.assert_array_equal(f(ROUGH.data, b, part), f(ROUGH.data, b, None))


def test_block_amg_pads_each_block_to_its_own_cycle(monkeypatch):
    # three blocks of 40 rows that coarsen differently (a 1-D Laplacian, a
    # 2-D one, a diagonal that does not coarsen at all), coupled: the padded,
    # stacked cycle of each block is its own hierarchy's cycle, and M^-1 is
    # symmetric positive definite
    import jax
    import jax.numpy as jnp

    from sciad.solvers.iterative import _amg, _block_amg

    monkeypatch.setattr(_amg, "MAX_COARSE", 6)
    m = 40
    T = sp.diags([-np.ones(m - 1), 2.2 * np.ones(m), -np.ones(m - 1)], [-1, 0, 1])
    T5 = sp.diags([-np.ones(4), 2 * np.ones(5), -np.ones(4)], [-1, 0, 1])
    T8 = sp.diags([-np.ones(7), 2 * np.ones(8), -np.ones(7)], [-1, 0, 1])
    L2 = sp.kron(sp.eye(8), T5) + sp.kron(T8, sp.eye(5)) + 0.1 * sp.eye(m)
    C = sp.coo_matrix(([-0.3, -0.3, -0.2, -0.2], ([m - 1, m, 2 * m, 2 * m - 1],
                                                 [m, m - 1, 2 * m - 1, 2 * m])),
                      shape=(3 * m, 3 * m))
    M = (sp.block_diag([T, L2, sp.diags(np.linspace(1.0, 2.0, m))]) + C).tocsr()
    M.sort_indices()
    pattern = sd.sparse.from_scipy(M).type.pattern
    bs = _block_amg.block_structure(pattern, 3)
    own = [len(s.levels) for s in bs.structures]
    assert own[2] == 0 < own[0] and bs.levels == max(own)  # (pass-through levels)
    a = jnp.asarray(M.data)
    arrays = _block_amg.setup(a, bs)
    a0 = _block_amg.block_values(bs, a)
    index = [tuple(jnp.asarray(x) for x in lv) for lv in bs.index]
    blocks = jax.vmap(lambda *z: _block_amg.vcycle(bs, *z))
    got = np.asarray(jax.jit(jax.vmap(lambda v: blocks(arrays, index, a0, v.reshape(3, m))
                                      .ravel()))(jnp.eye(3 * m))).T
    for d, s in enumerate(bs.structures):
        blk = M[d * m:(d + 1) * m, d * m:(d + 1) * m].tocsr()
        blk.sort_indices()
        own_arrays = _amg._setup_one(s, blk.data, np.float64)
        want = np.asarray(jax.jit(jax.vmap(lambda v: _amg.vcycle(
            s, own_arrays, jnp.asarray(blk.data), v)))(jnp.eye(m))).T
        np.testing.assert_allclose(got[d * m:(d + 1) * m, d * m:(d + 1) * m], want,
                                   rtol=1e-12, atol=1e-14)
    assert np.abs(got[:m, m:]).max() == 0.0 and np.abs(got[m:2 * m, 2 * m:]).max() == 0.0
    np.testing.assert_allclose(got, got.T, atol=1e-12)
    assert np.linalg.eigvalsh(got).min() > 0


@pytest.mark.slow
def test_a_batch_of_right_hand_sides_is_a_map_of_sharded_solves(child_preconditioned):
    assert child_preconditioned["vmap_err"] < 1e-12


@pytest.mark.slow
def test_rules_check_with_a_partition():
    # (no mesh here: the rules and the partition param; the sharded values
    # and gradients are compared with one device's above. gmres: the rules'
    # random directions make the matrix nonsymmetric)
    part = sd.sparse.row_partition(pat, 4, "rows")
    sd.testing.check_rules(lambda d, b: solve(d, b, "gmres", part), DATA["gmres"], b,
                           batch=False, second_order=False)


def test_a_partition_for_another_device_count_is_refused(child):
    name, msg = child["wrong_devices"]
    assert name == "ShapeError" and "over 2 devices, but mesh axis 'rows' has 4" in msg
    assert "linalg.solve" in msg


def test_a_mesh_with_explicit_axes_is_refused(child):
    name, msg = child["explicit"]
    assert name == "NotSupportedError" and "AxisType.Auto" in msg


@pytest.mark.parametrize("solver", SOLVERS)
def test_without_a_mesh_it_is_the_one_device_solve(solver):
    part = sd.sparse.row_partition(pat, 4, "rows")
    d = DATA[solver]
    f = sd.function(sd.value_and_grad(lambda d, b, p: loss(d, b, solver, p), argnums=(0, 1)),
                    static_argnums=2)
    (v, (gd, gb)), (v0, (gd0, gb0)) = f(d, b, part), f(d, b, None)
    assert float(v) == float(v0)
    np.testing.assert_array_equal(gd, gd0)
    np.testing.assert_array_equal(gb, gb0)


def test_the_partition_is_a_param_of_the_solve_and_its_adjoint():
    part = sd.sparse.row_partition(pat, 4, "rows")
    g = sd.trace(sd.grad(lambda d, b: loss(d, b, "gmres", part), argnums=(0, 1)),
                 DATA["gmres"], b)
    solves = [nd for nd in g.nodes if nd.primitive.name == "linalg.solve"]
    assert len(solves) == 2 and all(nd.params["partition"] == part for nd in solves)
    assert sorted(nd.params.get("transpose", False) for nd in solves) == [False, True]
    names = {nd.primitive.name for nd in g.nodes}
    assert "sparse.sharded_sddmm" in names and "sparse.sddmm" not in names
    # the partition travels through serialization
    again = sd.graph.Graph.from_json(g.to_json())
    assert [nd.params.get("partition") for nd in again.nodes
            if nd.primitive.name == "linalg.solve"] == [part, part]


def test_trace_time_refusals():
    part = sd.sparse.row_partition(pat, 4, "rows")
    d = DATA["cg"]
    A = lambda d: sd.sparse.csr_matrix((d, pat.indices, pat.indptr), shape=(n, n))  # noqa: E731
    with pytest.raises(InvalidOptionError, match="shards the Krylov loop of an iterative"):
        sd.trace(lambda d, b: sd.linalg.solve(A(d), b, solver="splu", partition=part), d, b)
    with pytest.raises(InvalidOptionError, match="pass `partition=`"):
        sd.trace(lambda d, b: sd.linalg.solve(A(d), b, solver="cg", preconditioner="block_amg"),
                 d, b)
    with pytest.raises(InvalidOptionError, match="preconditioned per device"):
        sd.trace(lambda d, b: sd.linalg.solve(A(d), b, solver="cg", preconditioner="amg",
                                              partition=part), d, b)
    other = sd.sparse.row_partition(sd.sparse.from_scipy(sp.eye(n, format="csr")).type.pattern,
                                    4, "rows")
    with pytest.raises(ShapeError, match="must be the RowPartition of the matrix's pattern"):
        sd.trace(lambda d, b: sd.linalg.solve(A(d), b, solver="cg", partition=other), d, b)
    # a diagonal entry not stored: refused by both preconditioners that divide by it
    off = sp.csr_matrix(np.roll(np.eye(n), 1, axis=1) + np.roll(np.eye(n), -1, axis=1))
    off_pat = sd.sparse.from_scipy(off).type.pattern
    off_part = sd.sparse.row_partition(off_pat, 4, "rows")
    for pre in ("jacobi", "block_amg"):
        with pytest.raises(StructureError, match="needs every diagonal entry stored"):
            sd.trace(lambda d, b: sd.linalg.solve(
                sd.sparse.csr_matrix((d, off_pat.indices, off_pat.indptr), shape=(n, n)), b,
                solver="gmres", preconditioner=pre, partition=off_part), off.data, b)
    # "auto" with a partition: a Krylov solver (cg for an spd matrix)
    g = sd.trace(lambda d, b: sd.linalg.solve(A(d), b, assume="spd", partition=part), d, b)
    (node,) = [nd for nd in g.nodes if nd.primitive.name == "linalg.solve"]
    assert node.params["solver"] == "cg"


def test_throw_false_reports_with_the_sharded_product():
    part = sd.sparse.row_partition(pat, 4, "rows")
    x, info = sd.function(lambda d, b: solve(d, b, "gmres", part, throw=False))(
        DATA["gmres"], b)
    assert bool(info.converged) and float(info.residual) < 1e-11
    np.testing.assert_allclose(NONSYM @ np.asarray(x), b, atol=1e-9)


def test_cost_names_the_partition():
    part = sd.sparse.row_partition(pat, 4, "rows")
    text = str(sd.cost(lambda d, b: solve(d, b, "cg", part, preconditioner="block_amg"),
                       DATA["cg"], b))
    assert "rows over 4 devices of 'rows', 32 values received per product" in text
    assert "block_amg: 4 blocks" in text
