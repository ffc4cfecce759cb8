import os
import zlib

# Most of the default suite's time is XLA compiling small CPU programs; LLVM's
# optimization of the generated code, and the MLIR fusion emitters (the older
# emitters compile faster), are a third of that and buy nothing on test-sized
# arrays, so the tests compile without them (set before JAX's backend starts;
# subprocesses inherit it). Results can differ from an
# optimized build in the last bits (1e-14 relative), as between CPUs.
# SCIAD_TEST_XLA_OPT=1, or an optimization level in XLA_FLAGS, keeps XLA's.
# Only with the jaxlib versions these flags were tried with: XLA aborts on a
# flag it does not know, and a later XLA may drop one.
_FAST_COMPILE = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                 "--xla_cpu_use_fusion_emitters=false")
_FAST_COMPILE_JAXLIB = ("0.10.",)


def _jaxlib_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jaxlib")
    except PackageNotFoundError:
        return ""


if (not os.environ.get("SCIAD_TEST_XLA_OPT")
        and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", "")
        and _jaxlib_version().startswith(_FAST_COMPILE_JAXLIB)):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAST_COMPILE}".strip()

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import sciad as sd  # noqa: E402


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


@pytest.fixture(scope="session")
def mosaic():
    """bench/mosaic.py (Mosaic's mesh tasks rebuilt), imported as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_bench_mosaic", os.path.join(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))), "bench", "mosaic.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
