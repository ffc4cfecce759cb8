"""sciad on JAX's distributed runtime: 2 local processes joined by
`jax.distributed.initialize` (coordinator and gloo collectives on
127.0.0.1), 2 CPU devices each, one global mesh of 4 devices.

The harness is tests/_multiprocess.py, the workload tests/_multiprocess_work.py:
an ensemble of 8 sparse inverse problems split over the 4 devices (values
and gradients through `sd.function` with global shardings) and a few
L-BFGS-B steps of `sd.optimize.minimize` with a sharded objective, and a
sparse matrix whose rows are split over the 4 devices (`sd.sparse.sharded_matmul`,
its halo exchange crossing the processes). Every
result is compared with the same computed unsharded in this process.
"""

from __future__ import annotations

import ipaddress
import itertools
import socket

import numpy as np
import pytest

import _multiprocess
import _multiprocess_work as work


@pytest.fixture(scope="module")
def results():
    return _multiprocess.run("_multiprocess_work", num_processes=2, devices=2, timeout=150)


@pytest.fixture(scope="module")
def reference():
    return work.reference()


def test_two_processes_make_one_mesh_of_four_devices(results):
    assert [r["process"] for r in results] == [0, 1]
    for r in results:
        assert r["processes"] == 2 and r["devices"] == 4 and r["local_devices"] == 2
    # each process holds the rows of its own two devices
    assert results[0]["rows"] == [0, 2] and results[1]["rows"] == [4, 6]


def test_sharded_ensemble_equals_one_process(results, reference):
    want_f, want_g = np.array(reference["values"]), np.array(reference["grads"])
    for r in results:
        np.testing.assert_allclose(r["values"], want_f, rtol=1e-13, atol=0)
        np.testing.assert_allclose(r["values_mesh_from_args"], want_f, rtol=1e-13, atol=0)
        np.testing.assert_allclose(r["grads"], want_g, rtol=1e-12, atol=1e-15)
        assert r["value_spec"] == r["grad_spec"] == "P('batch',)"
        assert r["local_shapes"] == [[2, 10], [2, 10]]


def test_each_process_solves_only_its_own_examples(results):
    # 8 examples over 4 devices: every SuperLU host call of every process
    # gets its device's 2 examples, never the gathered 8
    for r in results:
        assert r["host_call_batches"] == [2]


def test_numpy_inputs_with_a_sharded_layout_are_refused_by_jax(results):
    # across processes a whole NumPy array cannot be laid out by
    # in_shardings: JAX says so and names the fix (the docs show it)
    for r in results:
        name, msg = r["numpy_inputs"]
        assert name == "ValueError" and "make_array_from_process_local_data" in msg


def test_sharded_objective_optimizes_as_in_one_process(results, reference):
    want = reference["optimize"]
    assert want["nit"] == work.STEPS and len(want["iterates"]) == work.STEPS
    a, b = (r["optimize"] for r in results)
    # both processes drive SciPy with the same values: identical iterates
    assert a["iterates"] == b["iterates"] and a["fun"] == b["fun"]
    np.testing.assert_allclose(a["iterates"], want["iterates"], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(a["fun"], want["fun"], rtol=1e-12)
    assert a["nit"] == want["nit"]


def _loopback(addr: str) -> bool:
    ip = ipaddress.ip_address(addr)
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback


def test_nothing_leaves_the_loopback_interface(results):
    # every socket is bound to a loopback address (never to all interfaces)
    # and connected to one; a listening socket has no remote end
    for r in results:
        assert r["sockets"], "no TCP socket seen: /proc not readable?"
        for local, remote, state in r["sockets"]:
            assert _loopback(local), (local, remote, state)
            assert _loopback(remote) or (state == "0A" and ipaddress.ip_address(
                remote).is_unspecified), (local, remote, state)


def test_harness_kills_the_job_and_reports_when_a_process_fails():
    # process 1 raises while process 0 waits for it at a collective
    with pytest.raises(AssertionError) as info:
        _multiprocess.run("_multiprocess_fail", timeout=60)
    msg = str(info.value)
    assert "a process failed" in msg and "planted failure in process 1" in msg
    # process 0 was killed (-9), not left waiting for its peer
    assert "process 0: exit status -9" in msg and "process 1: exit status 1" in msg


def test_harness_moves_to_another_port_when_its_port_is_taken(monkeypatch):
    # another program takes the picked port before the coordinator binds it:
    # the coordinator cannot start, and the job is started again elsewhere
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1]])
        free = _multiprocess.free_port
        monkeypatch.setattr(_multiprocess, "free_port", lambda: next(ports, None) or free())
        with pytest.raises(AssertionError) as info:
            _multiprocess.run("_multiprocess_fail", timeout=60)
    assert "planted failure in process 1" in str(info.value)  # the second run's failure


def test_harness_kills_the_job_at_its_timeout():
    # a workload that never ends: the timeout, not a failure, ends the job
    # (a failing workload can fail before a short timeout on a fast machine)
    with pytest.raises(AssertionError, match="timed out after 1 s") as info:
        _multiprocess.run("_multiprocess_hang", timeout=1)
    # both processes were killed, none left behind
    assert str(info.value).count("exit status -9") == 2


def test_the_run_fits_its_time_budget(results):
    # both processes start JAX, compile and run everything in this time
    assert max(r["wall_s"] for r in results) < 40


def test_sharded_sparse_product_across_processes_equals_one_process(results, reference):
    # A's 16 rows over the 4 devices of both processes: the halo exchange of
    # A @ x and of A.T @ x (and of their adjoints) crosses the processes
    want_v, want_gv, want_gx = reference["spmv"]
    for r, exchange in itertools.product(results, ["all_gather", "ppermute"]):
        v, gv, gx = r[f"spmv_{exchange}"]
        np.testing.assert_allclose(v, want_v, rtol=1e-14)
        np.testing.assert_allclose(gv, want_gv, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(gx, want_gx, rtol=1e-13, atol=1e-15)


def test_sharded_cg_across_processes_equals_one_process(results, reference):
    # a CG solve with A's 16 rows over the 4 devices of both processes: the
    # halo exchanges and the inner products' all-reduces cross the
    # processes; value and gradients (the adjoint's sharded solve) as in one
    want_v, want_gk, want_gb = reference["cg"]
    for r in results:
        v, gk, gb = r["cg"]
        np.testing.assert_allclose(v, want_v, rtol=1e-12)
        np.testing.assert_allclose(gk, want_gk, rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(gb, want_gb, rtol=1e-10, atol=1e-14)


# ---------------------------------------------------------------------------
# the ensemble example (examples/ensemble_inversion.py) on the 2 processes


@pytest.fixture(scope="module")
def ensemble():
    import _multiprocess_ensemble

    results = _multiprocess.run("_multiprocess_ensemble", num_processes=2, devices=2,
                                timeout=150)
    return results, _multiprocess_ensemble.SIZES


# (two processes of their own, 10 s: the mesh over two processes is the
# default run's `results`; the example on one process, test_examples)
@pytest.mark.slow
def test_ensemble_example_on_two_processes_equals_one_device(ensemble):
    results, sizes = ensemble
    p0, p1 = results
    assert [p0["process"], p1["process"]] == [0, 1]
    assert p0["processes"] == 2 and p0["devices"] == 4
    # process 0 solved the same problems on one device, unsharded: the same
    # media to rounding (the run raises otherwise)
    assert p0["check"]["m"] < 1e-8 and p0["check"]["f"] < 1e-8, p0["check"]
    assert "check" not in p1  # only process 0 checks
    # both processes hold the whole gathered result, the same one
    assert p0["m"] == p1["m"] and p0["f"] == p1["f"]
    assert np.shape(p0["m"]) == (sizes["problems"], sizes["n"] ** 2)
    f0, f = np.array(p0["f0"]), np.array(p0["f"])
    assert np.all(f < f0), (f0, f)  # every problem's objective went down
    # each process tested the gradient of the first problem it holds (rows
    # 0-1 on process 0's devices, 2-3 on process 1's)
    assert [(t["process"], t["problem"]) for t in p0["taylor"]] == [(0, 0), (1, 2)]
    for t in p0["taylor"]:
        assert np.all(np.abs(np.array(t["rates"]) - 2.0) < 0.1), t


@pytest.mark.slow  # ~13 s: two processes running the example (the two-process mesh runs by default)
def test_ensemble_example_prints_on_process_0_only(ensemble):
    (p0, p1), sizes = ensemble
    lines = p0["printed"].splitlines()
    assert lines[0].startswith(f"ensemble inversion: {sizes['problems']} problems")
    assert "2 process(es), 4 devices (2 on this process, cpu)" in lines[0]
    assert sum(ln.startswith("batch ") for ln in lines) == 2
    assert any(ln.startswith("batch 2/2: problems 4-7") for ln in lines)
    assert any(ln.startswith("check: one device") for ln in lines)
    assert "problem 0 (process 0)" in p0["printed"] and "problem 2 (process 1)" in p0["printed"]
    assert ("layout: data (4, 2, 9) split as P('batch',) over 4 devices, 1 problem(s) per device; "
            "process 0 problems 0-1 (2 devices); process 1 problems 2-3 (2 devices)"
            ) in p0["printed"]
    assert "sd.cost of a step: the arguments are laid out over 4, at most" in p0["printed"]
    assert not any(ln.startswith(("batch", "ensemble", "done", "check"))
                   for ln in p1["printed"].splitlines())


def test_cost_reports_the_layout_of_global_arrays(ensemble):
    # sd.cost on global arrays split over the 4 devices of both processes:
    # each device holds 1 of the 4 problems' media (64 values) and noise
    # (2 x 9)
    (p0, p1), sizes = ensemble
    for r in (p0, p1):
        c = r["cost"]
        assert c["devices"] == 4 and c["args_bytes"] == 4 * (64 + 18) * 8
        assert c["per_device"] == (64 + 18) * 8
        assert any(ln.startswith("devices: the arguments are laid out over 4, at most 656 B")
                   for ln in c["text"]), c["text"]


_SLURM_CHILD = r'''
import functools, runpy, sys
from jax._src import xla_bridge
# gloo on the loopback interface, as in the harness
make = xla_bridge._jax.make_gloo_tcp_collectives
xla_bridge._jax.make_gloo_tcp_collectives = functools.partial(make, hostname="127.0.0.1")
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


@pytest.mark.slow  # ~20 s: two processes start JAX and compile the example
def test_ensemble_example_finds_its_job_in_slurms_environment():
    """`--auto` (`jax.distributed.initialize()` with no arguments) under the
    variables `srun` sets, here set by hand for 2 local processes: JAX's
    SLURM detection gives the process count, the ids and the coordinator
    (the first host of the node list, on port 61440 + job id mod 4096)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    job = next(j for j in range(4096) if _port_free(61440 + j))
    port = 61440 + job
    base = dict(os.environ, SLURM_JOB_ID=str(job), SLURM_STEP_NODELIST="127.0.0.1",
                SLURM_NTASKS="2", JAX_PLATFORMS="cpu",
                JAX_COORDINATOR_BIND_ADDRESS=f"127.0.0.1:{port}",
                PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    args = [os.path.join(root, "examples", "ensemble_inversion.py"), "--auto", "--cpu",
            "--n", "8", "--sources", "2", "--problems", "2", "--batch", "2", "--iters", "2"]
    procs = [subprocess.Popen([sys.executable, "-c", _SLURM_CHILD, *args], cwd=root,
                              env=dict(base, SLURM_PROCID=str(i), SLURM_LOCALID=str(i)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    try:
        outs = [p.communicate(timeout=150) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), [o[1][-3000:] for o in outs]
    out = outs[0][0]
    assert "2 process(es), 2 devices (1 on this process, cpu)" in out
    assert "process 0 problems 0-0 (1 devices); process 1 problems 1-1 (1 devices)" in out
    assert "batch 1/1" in out and "batch 1/1" not in outs[1][0]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
