"""Large zeros whose pages cost the rows written (`sciad.solvers._zeros`,
`csrc/zeros.cc`): what a loop's record starts from. They must be zeros
everywhere a reader looks, whatever the memory held before: here the
buffer XLA hands them is one a previous value of the same program filled
(its temporaries share one arena), with ends off the page boundaries."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sciad.solvers import _zeros

pytestmark = pytest.mark.skipif(_zeros._LIBRARY.get() is None or jax.default_backend() != "cpu",
                                reason="the lazy zeros are a CPU extension")


@pytest.mark.parametrize("shape, dtype", [((257, 1001), jnp.float64),    # 2 MB, ends mid-page
                                          ((3, 129, 1000), jnp.complex128),
                                          ((300, 1025), jnp.int32)])
def test_zeros_over_memory_that_held_values(shape, dtype):
    def f(x):
        # a temporary the size of z, made (the barrier) and freed before it
        dirty = jax.lax.optimization_barrier(jnp.full(shape, 7, dtype) * x.astype(dtype))
        used = jnp.sum(jnp.abs(dirty))
        z = jax.lax.optimization_barrier((_zeros.zeros(shape, dtype), used))[0]
        z = z.at[1].set(jnp.ones(shape[1:], dtype))
        return used, z

    want = np.zeros(shape, dtype)
    want[1] = 1
    g = jax.jit(f)
    for _ in range(3):  # (later calls get memory the earlier ones freed: malloc's heap)
        used, z = g(jnp.asarray(3.0))
        assert float(used) == 21.0 * np.prod(shape)
        np.testing.assert_array_equal(np.asarray(z), want)


def test_small_or_elsewhere_is_plain_zeros():
    # (below LARGE: jnp.zeros itself, no custom call in the program)
    text = jax.jit(lambda: _zeros.zeros((10, 10), jnp.float64)).lower().as_text()
    assert "sciad_zeros" not in text
    text = jax.jit(lambda: _zeros.zeros((1024, 1024), jnp.float64)).lower().as_text()
    assert "sciad_zeros" in text
    np.testing.assert_array_equal(np.asarray(jax.jit(
        lambda: _zeros.zeros((1024, 1024), jnp.float64))()), 0.0)
