"""The allocator set-up (perfdoctor.heap): it takes on glibc, the commands that analyse traces make it,
and importing or calling perfdoctor as a library does not."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from perfdoctor import heap
from tests.paths import REAL_H100
from tests.test_cli_bad_input import run_cli

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def test_it_takes_on_glibc_and_is_skipped_elsewhere() -> None:
    code = "from perfdoctor.heap import keep_freed_memory; print(keep_freed_memory())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(GLIBC)


@pytest.mark.parametrize("command", ["analyze", "diff"])
def test_the_analysing_commands_set_it_up(capsys, monkeypatch, command) -> None:
    calls = []
    monkeypatch.setattr(heap, "keep_freed_memory", lambda: calls.append(1) or True)
    args = [str(REAL_H100)] * (2 if command == "diff" else 1)
    code, _, err = run_cli(capsys, command, *args, "--format", "json")
    assert code == 0, err
    assert calls == [1]


def test_the_library_leaves_the_allocator_alone(monkeypatch) -> None:
    from perfdoctor import api

    monkeypatch.setattr(heap, "keep_freed_memory", lambda: pytest.fail("the library retuned malloc"))
    assert api.analyze([REAL_H100]).devices


def test_freed_heap_pages_go_back_only_after_columns_too_large_to_reuse_them() -> None:
    assert heap.give_back_freed(heap.MMAP_ABOVE - 1) is False  # later arrays of this size reuse the pages
    chunks = [bytearray(100_000) for _ in range(2_000)]  # heap chunks (below the mmap threshold) ...
    del chunks[:-1]  # ... freed below a live one, so only a trim gives their pages back
    assert heap.give_back_freed(heap.MMAP_ABOVE) is GLIBC


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="huge pages are a Linux kernel's")
def test_numpys_huge_page_advice_is_on_only_for_arrays_mapped_on_their_own() -> None:
    """After the set-up numpy no longer advises huge pages, except inside ``huge_pages_for`` a size past
    the mmap threshold (restored after); in a process that did not set it up, ``huge_pages_for`` changes
    nothing. numpy's switch returns the setting it replaces."""
    code = ("from numpy._core.multiarray import _set_madvise_hugepage as advise\n"
            "from perfdoctor import heap\n"
            "def now(): v = advise(False); advise(v); return v\n"
            "default = now()\n"
            "with heap.huge_pages_for(0): untouched = now()\n"
            "heap.keep_freed_memory()\n"
            "after_setup = now()\n"
            "with heap.huge_pages_for(heap.MMAP_ABOVE): big = now()\n"
            "with heap.huge_pages_for(heap.MMAP_ABOVE - 1): small = now()\n"
            "print(default, untouched, after_setup, big, small, now())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    default, untouched, after_setup, big, small, restored = out
    assert untouched == default
    assert (after_setup, big, small, restored) == ("False", "True", "False", "False")
