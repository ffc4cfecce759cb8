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


@pytest.fixture
def scratch_registry():
    """Primitives a test (or a documentation page) registers are forgotten
    afterwards."""
    from sciad.graph import _core

    before = dict(_core._REGISTRY)
    yield
    _core._REGISTRY.clear()
    _core._REGISTRY.update(before)
