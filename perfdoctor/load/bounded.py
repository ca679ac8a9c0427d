"""Run a parser of untrusted input in a forked child with a memory, CPU and wall-clock budget.

CPython's C unpickler cannot be interrupted: hashing a key built from shared nested tuples (a few
hundred bytes of pickle) runs for hours without returning to Python, and a memo index of 2³² asks
for gigabytes in one allocation. Budget checks inside the parent would never run. A child process
with ``RLIMIT_AS`` (total allocation) and ``RLIMIT_CPU`` (time) is stopped by the kernel whatever
the parser is doing, and the parent only ever sees the small result the child sends back.

The child sends its result as a pickle that the parent reads with an allowlist of classes (the
caller's own result types), so nothing the hostile input shaped can name code in the parent either.
Where ``fork`` does not exist (Windows) the parser runs in-process, unbounded.
"""

from __future__ import annotations

import gc
import io
import os
import pickle
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from perfdoctor.errors import InputError

_HEADER = 9  # 1 status byte + 8-byte length


@dataclass(frozen=True)
class Budget:
    """What one parse may use: address space beyond what the process already maps, and CPU seconds
    (the wall-clock limit is a multiple of it, for a machine busy with other work)."""

    memory_bytes: int
    cpu_s: float
    wall_factor: float = 4.0


class _Restricted(pickle.Unpickler):
    """Reads the child's answer, allowing only the classes the caller named."""

    def __init__(self, data: Any, allowed: frozenset[tuple[str, str]]) -> None:
        super().__init__(data)
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._allowed:
            raise pickle.UnpicklingError(f"unexpected {module}.{name} in a parser result")
        return super().find_class(module, name)


def run_bounded(parse: Callable[[], Any], budget: Budget, what: str,
                allowed: frozenset[tuple[str, str]]) -> Any:
    """``parse()`` in a child under ``budget``; its result, or its :class:`InputError` raised here.

    ``what`` names the input in the one-line errors (over budget, killed). ``allowed`` lists the
    ``(module, name)`` globals the result may contain.
    """
    if not hasattr(os, "fork"):
        return parse()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_fd)
        _child(parse, budget, write_fd)
    os.close(write_fd)
    try:
        status, payload = _receive(read_fd, pid, budget, what)
    finally:
        os.close(read_fd)
    if status == b"E":
        raise InputError(payload.decode("utf-8", "replace"))
    return _Restricted(io.BytesIO(payload), allowed).load()


def _child(parse: Callable[[], Any], budget: Budget, fd: int) -> None:
    code = 0
    try:
        import resource

        _lower_limit(resource.RLIMIT_AS, _mapped_bytes() + budget.memory_bytes)
        _lower_limit(resource.RLIMIT_CPU, int(time.process_time() + budget.cpu_s) + 1)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and kills us
        # The child exits as soon as it has answered, so its garbage never needs collecting; without
        # the cyclic collector running every few hundred allocations, unpickling millions of small
        # dicts is several times faster (the memory limit still bounds a pickle with cycles).
        gc.disable()
        try:
            status, body = b"R", pickle.dumps(parse(), protocol=pickle.HIGHEST_PROTOCOL)
        except InputError as exc:
            status, body = b"E", str(exc).encode()
        except MemoryError:
            status, body = b"M", b""
        _write_all(fd, status + len(body).to_bytes(8, "little") + body)
    except BaseException:  # noqa: BLE001 - anything else is a bug; the parent reports it as one
        code = 70
    finally:
        os._exit(code)  # no atexit handlers, no flushing of the parent's buffers


def _receive(fd: int, pid: int, budget: Budget, what: str) -> tuple[bytes, bytes]:
    wall_s = budget.cpu_s * budget.wall_factor + 5.0
    deadline = time.monotonic() + wall_s
    chunks, got, need = [], 0, _HEADER
    try:
        while got < need:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                _reap(pid)
                raise InputError(f"{what}: reading took longer than {wall_s:.0f} s (the time budget for a file "
                                 "of this size); not a plausible memory snapshot")
            chunk = os.read(fd, max(1 << 16, min(need - got, 1 << 24)))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
            if need == _HEADER and got >= _HEADER:
                need = _HEADER + int.from_bytes(b"".join(chunks)[1:_HEADER], "little")
    except BaseException:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            _reap(pid)
        raise
    data = b"".join(chunks)
    status_code = _reap(pid)
    if got >= _HEADER and got >= need:
        status = data[:1]
        if status == b"M":
            raise InputError(f"{what}: needs more than the {budget.memory_bytes / (1 << 20):,.0f} MiB memory budget "
                             "for a file of this size; not a plausible memory snapshot")
        return status, data[_HEADER:need]
    if os.WIFSIGNALED(status_code) and os.WTERMSIG(status_code) in (signal.SIGXCPU, signal.SIGKILL):
        raise InputError(f"{what}: reading needs more than the {budget.cpu_s:.0f} s CPU budget for a file of "
                         "this size; not a plausible memory snapshot")
    if os.WIFSIGNALED(status_code) and os.WTERMSIG(status_code) in (signal.SIGSEGV, signal.SIGBUS):
        raise InputError(f"{what}: the reader ran out of memory (budget {budget.memory_bytes / (1 << 20):,.0f} MiB)")
    raise RuntimeError(f"{what}: the reader process failed (status {status_code})")


def _lower_limit(which: int, value: int) -> None:
    """Set a soft limit, never above the hard limit the process already has (raising it would fail)."""
    import resource

    soft, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    if soft == resource.RLIM_INFINITY or value < soft:
        resource.setrlimit(which, (value, hard))


def _mapped_bytes() -> int:
    """Virtual memory this process maps now (the limit is on top of it: the interpreter and its
    libraries already map far more than they use)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 * 4


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _alive(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False


def _reap(pid: int) -> int:
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return 0
