"""Tracebacks of sciad's errors end in the user's code: sciad's and JAX's
internal frames are removed at the API boundaries (sciad/_traceback.py)."""

import os
import traceback

import jax
import numpy as np
import pytest

import sciad as sd
import sciad.errors as se
import sciad.numpy as snp

SCIAD_DIR = os.path.dirname(os.path.abspath(sd.__file__)) + os.sep
JAX_DIR = os.path.dirname(os.path.abspath(jax.__file__)) + os.sep


def frames(e: BaseException) -> list[str]:
    return [f.filename for f in traceback.extract_tb(e.__traceback__)]


def internal(e: BaseException) -> list[str]:
    return [f for f in frames(e) if f.startswith(SCIAD_DIR) or f.startswith(JAX_DIR)]


def solve_sum(A, b):
    return snp.sum(sd.linalg.solve(A, b))


def test_trace_time_error_keeps_the_user_frames_only():
    f = sd.function(solve_sum)
    with pytest.raises(se.ShapeError) as info:
        f(np.eye(3), np.ones(4))
    assert internal(info.value) == []
    names = [fr.name for fr in traceback.extract_tb(info.value.__traceback__)]
    assert "solve_sum" in names  # the user's line that failed is still there
    assert any("SCIAD_TRACEBACK_FILTERING" in n for n in info.value.__notes__)
    # one note, not JAX's as well
    assert not any("JAX has removed" in n for n in info.value.__notes__)


@pytest.mark.parametrize("call", [
    lambda A, b: sd.grad(solve_sum)(A, b),                 # a derivative, compiled
    lambda A, b: sd.linalg.solve(A, b),                    # eager
    lambda A, b: jax.grad(sd.to_jax(solve_sum))(A, b),     # through JAX's boundary
], ids=["grad", "eager", "jax.grad(to_jax)"])
def test_run_time_errors_have_no_internal_frames(call):
    with pytest.raises(se.SingularMatrixError) as info:
        call(np.zeros((3, 3)), np.ones(3))
    assert internal(info.value) == [], internal(info.value)
    assert frames(info.value)[-1] == __file__  # the user's call is the last frame


def test_a_users_own_exception_keeps_its_frame():
    def f(x):
        raise KeyError("the user's own bug")

    with pytest.raises(KeyError) as info:
        sd.function(f)(np.ones(2))
    assert internal(info.value) == []
    assert [fr.name for fr in traceback.extract_tb(info.value.__traceback__)][-1] == "f"


def test_filtering_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("SCIAD_TRACEBACK_FILTERING", "off")
    with pytest.raises(se.SingularMatrixError) as info:
        sd.linalg.solve(np.zeros((2, 2)), np.ones(2))
    assert any(f.startswith(SCIAD_DIR) for f in frames(info.value))
    assert not any("SCIAD_TRACEBACK_FILTERING" in n
                   for n in getattr(info.value, "__notes__", []))
