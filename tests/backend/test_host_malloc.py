"""backend.host_malloc: on glibc, importing minigrad raises malloc's mmap and trim thresholds (so a
step's large temporaries reuse freed pages); ``MINIGRAD_MALLOC=system`` leaves the allocator alone."""

import os
import subprocess
import sys

import pytest

from minigrad.backend import host_malloc


def _applied_in_a_new_process(**env) -> str:
    code = "import minigrad; from minigrad.backend import host_malloc; print(host_malloc.applied)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env},
                         check=True)
    return out.stdout.strip()


@pytest.mark.skipif(not host_malloc._glibc(), reason="the thresholds are glibc's")
def test_importing_minigrad_sets_the_thresholds_on_glibc():
    assert host_malloc.applied and host_malloc.keep_freed_memory()  # set once; asking again says so
    assert _applied_in_a_new_process() == "True"


def test_minigrad_malloc_system_leaves_the_allocator_alone():
    assert _applied_in_a_new_process(MINIGRAD_MALLOC="system") == "False"
