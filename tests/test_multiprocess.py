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
