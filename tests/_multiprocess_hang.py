"""A workload that never ends (tests/test_multiprocess.py checks that the
harness kills the job at its timeout): every process waits, whatever the
speed of the machine that starts it."""

import time


def run() -> dict:
    while True:
        time.sleep(1.0)
