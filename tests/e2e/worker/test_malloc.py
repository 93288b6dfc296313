"""A worker keeps the memory its builds free (worker/process/malloc.py): a process that allocates and frees the same
large buffers again and again, as a build does, faults in fresh pages only the first time. Each case runs in a process
of its own, since the thresholds are the process's."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from enginefarm.core.config import Settings

ALLOCATE_AND_FREE = """
import resource, sys
from worker.process.malloc import keep_freed_memory
print(keep_freed_memory(int(sys.argv[1])))
def round_trip():
    for size in (48 << 20, 20 << 20, 3 << 20):  # a plan, weights, a tensor: each written whole, then freed
        buffer = bytearray(size)
        buffer[::4096] = b"x" * len(buffer[::4096])
        del buffer
round_trip()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    round_trip()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(keep_mib: int) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", ALLOCATE_AND_FREE, str(keep_mib)], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1])


def test_freed_memory_is_kept_so_the_same_buffers_fault_no_fresh_pages():
    applied, faults = _faults(256)
    assert applied == "True"
    assert faults < 500, f"{faults} page faults in ten rounds of the same buffers"


def test_glibcs_own_thresholds_fault_every_round_the_control():
    applied, faults = _faults(0)
    assert applied == "False"  # 0 leaves glibc's thresholds as they are
    assert faults > 10 * (48 << 20) // 4096 // 2, f"only {faults} page faults: the control no longer shows the cost"


def test_the_setting_stays_within_what_mallopt_takes():
    """mallopt's value is a C int of bytes: 2047 MiB is the most (set in a process of its own); a larger setting is
    refused when the settings are read."""
    probe = "from worker.process.malloc import keep_freed_memory; print(keep_freed_memory(2047))"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip() == (
        "True"
    )
    with pytest.raises(ValidationError, match="worker_malloc_keep_mib"):
        Settings(worker_malloc_keep_mib=2048)
