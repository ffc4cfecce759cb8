"""A workload that fails on purpose (tests/test_multiprocess.py checks that
the harness ends the job and reports it): process 1 raises while process 0
waits for it at a collective."""

import jax
import numpy as np
from jax.experimental import multihost_utils


def run() -> dict:
    if jax.process_index() == 1:
        raise RuntimeError("planted failure in process 1")
    multihost_utils.process_allgather(np.zeros(2))
    return {}
