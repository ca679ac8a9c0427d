"""Pickle bombs given as memory snapshots: each is refused with exit 2 and one line, in bounded time and memory.

Every case runs ``python -m perfdoctor`` in a subprocess with an address-space limit and a timeout, so a
regression fails the test instead of taking the (shared) machine down. The bombs are written opcode by
opcode: each is a few hundred bytes that the C unpickler (or a naive validator) turns into hours of CPU
or gigabytes.
"""

from __future__ import annotations

import os
import pickle
import resource
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.paths import REPO

LIMIT_AS = 3 << 30  # the test's own ceiling for perfdoctor and its reader child
TIMEOUT_S = 90
MAX_WALL_S = 60  # generous for a busy machine: the reader's CPU budget for a small file is a few seconds
MAX_RSS = 1536 << 20


def _put(i: int) -> bytes:
    return b"q" + bytes([i])  # BINPUT


def _get(i: int) -> bytes:
    return b"h" + bytes([i])  # BINGET


def nested_tuple(levels: int) -> bytes:
    """t_{k+1} = (t_k, t_k) through the memo: 5 bytes a level, 2**levels elements to hash."""
    out = b")"  # EMPTY_TUPLE
    for i in range(levels):
        out += _put(i) + _get(i) + b"\x86"  # TUPLE2
    return out


def nested_list(levels: int) -> bytes:
    """l_{k+1} = [l_k, l_k]: linear to build, exponential to walk or print."""
    out = b"]"  # EMPTY_LIST
    for i in range(levels):
        out += _put(i) + b"0" + b"](" + _get(i) + _get(i) + b"e"  # POP, EMPTY_LIST, MARK, APPENDS
    return out


def text(s: str) -> bytes:
    data = s.encode()
    return b"\x8c" + bytes([len(data)]) + data  # SHORT_BINUNICODE


def snapshot_with(key: str, value: bytes) -> bytes:
    """{"segments": [], "device_traces": [[{"action": "alloc", "addr": 0, "size": 1, key: value}]]}"""
    entry = b"}(" + text("action") + text("alloc") + text("addr") + b"K\x00" + text("size") + b"K\x01" + \
        text(key) + value + b"u"
    return b"\x80\x04}(" + text("segments") + b"]" + text("device_traces") + b"](" + b"](" + entry + b"e" + b"e" + \
        b"u."


def hash_bomb() -> bytes:
    """A dict keyed by a 2**50-element shared tuple: the C unpickler hashes it while loading."""
    return b"\x80\x02}" + nested_tuple(50) + b"Ns."


def frame_hash_bomb() -> bytes:
    """The same tuple as a frame's file name inside a valid snapshot: hashed when stacks are interned."""
    frame = b"}(" + text("filename") + nested_tuple(50) + text("line") + b"K\x01" + text("name") + text("f") + b"u"
    return snapshot_with("frames", b"](" + frame + b"e")


def list_bomb() -> bytes:
    """A 2**90-element shared list as a block's state: printing it in an error message never ends."""
    block = b"}(" + text("size") + b"K\x01" + text("state") + nested_list(90) + b"u"
    seg = b"}(" + text("address") + b"K\x00" + text("blocks") + b"](" + block + b"e" + b"u"
    return b"\x80\x04}(" + text("segments") + b"](" + seg + b"e" + b"u."


def action_list_bomb() -> bytes:
    """The shared list as an event's action."""
    return b"\x80\x04}(" + text("segments") + b"]" + text("device_traces") + b"](](}(" + text("action") + \
        nested_list(90) + b"ueeu."


def memo_bomb() -> bytes:
    """9 bytes: LONG_BINPUT 2**32 - 1 makes the unpickler size its memo for four billion entries."""
    return b"\x80\x04N" + b"r" + struct.pack("<I", 0xFFFFFFFF) + b"."


def text_memo_bomb() -> bytes:
    return b"(lp99999999999\n."  # PUT with a decimal index


def length_bomb() -> bytes:
    """BINBYTES8 that claims a terabyte: nothing may allocate it."""
    return b"\x80\x04\x8e" + struct.pack("<Q", 1 << 40) + b"x."


def frame_length_bomb() -> bytes:
    return b"\x80\x04\x95" + struct.pack("<Q", 1 << 40) + b"N."


def deep_bomb() -> bytes:
    """100,000 lists nested in each other."""
    return b"\x80\x02" + b"]" * 100_000 + b"a" * 99_999 + b"."


def amplification_bomb() -> bytes:
    """One segment of 16 blocks repeated 600,000 times through the memo (2 bytes each): 9.6M blocks, under
    every count limit, from 1.2 MB."""
    block = b"}(" + text("size") + b"K\x01" + text("state") + text("inactive") + b"u"
    seg = b"}(" + text("address") + b"K\x00" + text("blocks") + b"](" + block * 16 + b"e" + b"u" + _put(0)
    items = b"(" + _get(0) * 1000 + b"e"
    return b"\x80\x04}(" + text("segments") + b"](" + seg + b"e" + items * 600 + b"u."


BOMBS = {
    "hash": hash_bomb, "frame-hash": frame_hash_bomb, "nested-list": list_bomb, "action-list": action_list_bomb,
    "memo": memo_bomb, "text-memo": text_memo_bomb, "length": length_bomb, "frame-length": frame_length_bomb,
    "deep": deep_bomb, "amplification": amplification_bomb,
}


def run_limited(args: list[str]) -> tuple[subprocess.CompletedProcess, float, int]:
    """``python -m perfdoctor ARGS`` under LIMIT_AS and TIMEOUT_S; (result, wall seconds, peak RSS bytes of
    perfdoctor and its reader child, from ``wait4``)."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT_AS, LIMIT_AS))

    start = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-m", "perfdoctor", *args], cwd=REPO, stdout=out, stderr=err,
                                preexec_fn=limit, env={**os.environ, "COLUMNS": "200"})
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - start > TIMEOUT_S:
                proc.kill()
                os.wait4(proc.pid, 0)
                pytest.fail(f"perfdoctor {' '.join(args)} still running after {TIMEOUT_S} s")
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        result = subprocess.CompletedProcess(proc.args, proc.returncode, out.read().decode(), err.read().decode())
    return result, wall, usage.ru_maxrss * 1024


def assert_refused(result: subprocess.CompletedProcess, wall: float, peak: int, path: Path) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert len(lines) == 1 and str(path.name) in lines[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert wall < MAX_WALL_S, f"{wall:.1f} s"
    assert peak < MAX_RSS, f"{peak / (1 << 20):,.0f} MiB"


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_bomb_is_refused_in_bounded_time_and_memory(tmp_path, name):
    data = BOMBS[name]()
    path = tmp_path / f"rank0_{name}.pickle"
    path.write_bytes(data)
    assert_refused(*run_limited(["memory", str(path)]), path)
    assert path.read_bytes() == data  # the input is never modified


def test_bomb_in_a_run_directory_stops_analyze(tmp_path):
    path = tmp_path / "rank0.pickle"
    path.write_bytes(hash_bomb())
    (tmp_path / "trace.sqlite").write_bytes((REPO / "sample_traces" / "real_h100" /
                                             "h100_2gpu_fastvideo.sqlite").read_bytes())
    assert_refused(*run_limited(["analyze", str(tmp_path)]), path)


def test_bombs_are_what_they_claim():
    """The bombs are what their names say (checked from their opcodes; none is ever loaded here)."""
    import pickletools

    assert len(memo_bomb()) == 9 and len(hash_bomb()) < 300 and len(list_bomb()) < 1000
    ops = [op.name for op, _, _ in pickletools.genops(hash_bomb())]
    assert ops.count("TUPLE2") == 50 and ops[-2:] == ["SETITEM", "STOP"]
    ops = [op.name for op, _, _ in pickletools.genops(amplification_bomb())]
    assert ops.count("BINGET") == 600_000
    assert pickle.loads(nested_tuple(2) + b".") == (((), ()), ((), ()))  # the construction itself
