"""A harness that runs one workload on several local processes joined by
JAX's distributed runtime (`jax.distributed`), on CPU devices with gloo
collectives, as a job on several hosts would run it.

The parent side (`run`) picks a free loopback port, starts one Python
process per process id with a hard timeout, kills them all if one fails or
the time is up, and returns what each printed on its `RESULT ` line (JSON).
On failure it raises with each child's exit status and the tail of its
stderr.

The child side (`child_main`, run as `python -c ...` by `run`) sets the
environment before JAX is imported (CPU platform, `devices` simulated
devices per process, x64), calls `jax.distributed.initialize` with the
coordinator on 127.0.0.1, runs `<workload module>.run()` and prints its
dict. It reports the addresses of every TCP socket it holds so that a test
can check that nothing left the loopback interface.

Only the standard library is imported at module level: the child must set
`XLA_FLAGS` and `JAX_PLATFORMS` before JAX starts.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULT = "RESULT "


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(workload: str, num_processes: int = 2, devices: int = 2, timeout: float = 120.0,
        env: dict | None = None) -> list[dict]:
    """Runs `workload.run()` (a module in tests/) on `num_processes` local
    processes with `devices` CPU devices each; returns each process's result
    dict, in process-id order, with `"wall_s"` (its run time) and `"sockets"`
    added. The port is free when picked; should another program take it
    before the coordinator binds it, the job is started once more on
    another port."""
    try:
        return _run(workload, num_processes, devices, timeout, env)
    except _PortTaken:
        return _run(workload, num_processes, devices, timeout, env)


class _PortTaken(AssertionError):
    pass


def _run(workload, num_processes, devices, timeout, env) -> list[dict]:
    port = free_port()
    code = f"import _multiprocess; _multiprocess.child_main({workload!r})"
    base = dict(os.environ, **(env or {}))
    base["PYTHONPATH"] = os.pathsep.join([HERE, ROOT] + [p for p in [os.environ.get(
        "PYTHONPATH")] if p])
    procs, files = [], []
    start = time.monotonic()
    try:
        for pid in range(num_processes):
            # files, not pipes: a child that writes much never blocks on a
            # full pipe that nobody reads
            files.append((tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")))
            child_env = dict(base, SCIAD_MP_COORDINATOR=f"127.0.0.1:{port}",
                             SCIAD_MP_NUM_PROCESSES=str(num_processes),
                             SCIAD_MP_PROCESS_ID=str(pid), SCIAD_MP_DEVICES=str(devices))
            procs.append(subprocess.Popen([sys.executable, "-c", code], cwd=ROOT,
                                          env=child_env, stdout=files[-1][0],
                                          stderr=files[-1][1], text=True))
        timed_out = False
        # One deadline for all; a child that fails early leaves the others
        # waiting at a collective, so one failure ends them all.
        while any(p.poll() is None for p in procs):
            if any(p.returncode for p in procs if p.poll() is not None):
                break
            if time.monotonic() - start > timeout:
                timed_out = True
                break
            time.sleep(0.05)
    finally:
        _kill(procs)
    outs = []
    for f_out, f_err in files:
        texts = []
        for f in (f_out, f_err):
            f.seek(0)
            texts.append(f.read())
            f.close()
        outs.append(texts)
    results, report = [], []
    for pid, (p, (stdout, stderr)) in enumerate(zip(procs, outs)):
        lines = [ln for ln in stdout.splitlines() if ln.startswith(RESULT)]
        results.append(json.loads(lines[-1][len(RESULT):]) if lines else None)
        report.append(f"--- process {pid}: exit status {p.returncode}, stderr tail:\n"
                      f"{stderr[-3000:]}")
    if timed_out or any(r is None for r in results) or any(p.returncode for p in procs):
        why = f"timed out after {timeout:.0f} s" if timed_out else "a process failed"
        if "Failed to add port" in outs[0][1]:  # (gRPC, then a crash)
            raise _PortTaken(f"port {port} taken")
        raise AssertionError(f"multi-process run of {workload!r}: {why}\n" + "\n".join(report))
    return results


def _kill(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


# ---------------------------------------------------------------------------
# child side


def child_main(workload: str) -> None:
    """The entry point of one process (see `run`)."""
    t0 = time.monotonic()
    devices = int(os.environ["SCIAD_MP_DEVICES"])
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={devices}").strip()
    import functools
    import importlib

    import jax
    from jax._src import xla_bridge

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # gloo binds to the address the host name resolves to; pin it to the
    # loopback interface (jax has no public option for this).
    make = xla_bridge._jax.make_gloo_tcp_collectives
    xla_bridge._jax.make_gloo_tcp_collectives = functools.partial(make, hostname="127.0.0.1")
    address = os.environ["SCIAD_MP_COORDINATOR"]
    jax.distributed.initialize(coordinator_address=address,
                               num_processes=int(os.environ["SCIAD_MP_NUM_PROCESSES"]),
                               process_id=int(os.environ["SCIAD_MP_PROCESS_ID"]),
                               coordinator_bind_address=address, initialization_timeout=60)
    try:
        out = importlib.import_module(workload).run()
        out["sockets"] = _socket_addresses()
        out["wall_s"] = time.monotonic() - t0
        print(RESULT + json.dumps(out), flush=True)
    except BaseException:
        # Exit now: JAX's exit handler would wait for the other processes
        # at a shutdown barrier (up to minutes) before this one ends.
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    jax.distributed.shutdown()


def _socket_addresses() -> list[list[str]]:
    """`[local IP, remote IP, state]` of every TCP socket this process holds,
    from /proc (Linux; state "0A" is listening); empty elsewhere."""
    try:
        inodes = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                link = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
        found = set()
        for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
            with open(table) as fh:
                for line in fh.readlines()[1:]:
                    cols = line.split()
                    if cols[9] in inodes:
                        found.add((_ip(cols[1].split(":")[0], width),
                                   _ip(cols[2].split(":")[0], width), cols[3]))
        return sorted(list(f) for f in found)
    except OSError:
        return []


def _ip(hexaddr: str, width: int) -> str:
    raw = bytes.fromhex(hexaddr)
    # /proc prints each 32-bit word in host (little-endian) order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if width == 8 else socket.AF_INET6
    return socket.inet_ntop(family, words)
