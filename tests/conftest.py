import zlib

import numpy as np
import pytest

import sciad as sd


@pytest.fixture(autouse=True)
def _checks_on():
    """Every test runs with graph verification after each transform."""
    with sd.config.checks(True):
        yield


@pytest.fixture
def rng(request):
    """A NumPy generator seeded from the test's name: fresh per test, reproducible."""
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)
