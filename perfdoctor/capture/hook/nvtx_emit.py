"""NVTX ranges and marks in the ``perfdoctor`` domain, from inside a training process.

Two back ends, tried in order:

* the ``nvtx`` PyPI package. From 0.2.12 on it gates every domain on ``nvtxDomainIsEnabled()``, which
  the injection library of nsys 2022.4 does not implement, so every domain becomes a do-nothing
  ``DummyDomain`` (research/nsys_local.md §1); under a tool (``NVTX_INJECTION64_PATH`` set) we create
  real domains as 0.2.11 did.
* the C API through ctypes (``libnvToolsExt.so.1`` of the CUDA toolkit, or ``libnvtx3interop.so.1`` of
  the ``nvidia-nvtx-cu12`` wheel), for processes without the package.

Without either, labels are off and the caller says so once. Nothing here raises into training code.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

DOMAIN = "perfdoctor"


class Emitter:
    """start/end ranges, push/pop ranges and marks in one NVTX domain."""

    backend: str = "none"

    def start(self, message: str) -> Any:
        return None

    def end(self, handle: Any) -> None:
        pass

    def push(self, message: str) -> None:
        pass

    def pop(self) -> None:
        pass

    def mark(self, message: str) -> None:
        pass


class _Package(Emitter):
    backend = "nvtx"

    def __init__(self, nvtx: Any) -> None:
        self._nvtx = nvtx

    def start(self, message: str) -> Any:
        return self._nvtx.start_range(message=message, domain=DOMAIN)

    def end(self, handle: Any) -> None:
        self._nvtx.end_range(handle)

    def push(self, message: str) -> None:
        self._nvtx.push_range(message=message, domain=DOMAIN)

    def pop(self) -> None:
        self._nvtx.pop_range(domain=DOMAIN)

    def mark(self, message: str) -> None:
        self._nvtx.mark(message=message, domain=DOMAIN)


class _CApi(Emitter):
    """The classic C API: ``nvtxDomainCreateA`` + ``nvtxDomain{RangeStartEx,RangePushEx,MarkEx}`` with an
    ASCII message in an ``nvtxEventAttributes_t``."""

    backend = "ctypes"

    class _Attributes(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint16), ("size", ctypes.c_uint16), ("category", ctypes.c_uint32),
                    ("colorType", ctypes.c_int32), ("color", ctypes.c_uint32), ("payloadType", ctypes.c_int32),
                    ("reserved0", ctypes.c_int32), ("payload", ctypes.c_uint64), ("messageType", ctypes.c_int32),
                    ("message", ctypes.c_char_p)]

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        lib.nvtxDomainCreateA.restype = ctypes.c_void_p
        lib.nvtxDomainCreateA.argtypes = [ctypes.c_char_p]
        for name in ("nvtxDomainRangeStartEx", "nvtxDomainRangePushEx", "nvtxDomainMarkEx"):
            getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.POINTER(self._Attributes)]
        lib.nvtxDomainRangeStartEx.restype = ctypes.c_uint64
        lib.nvtxDomainRangeEnd.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
        lib.nvtxDomainRangePop.argtypes = [ctypes.c_void_p]
        self._domain = lib.nvtxDomainCreateA(DOMAIN.encode())

    def _attrs(self, message: str) -> Any:
        attrs = self._Attributes(version=3, size=ctypes.sizeof(self._Attributes), messageType=1,  # ASCII
                                 message=message.encode("ascii", "replace"))
        return ctypes.byref(attrs)

    def start(self, message: str) -> Any:
        return self._lib.nvtxDomainRangeStartEx(self._domain, self._attrs(message))

    def end(self, handle: Any) -> None:
        self._lib.nvtxDomainRangeEnd(self._domain, handle)

    def push(self, message: str) -> None:
        self._lib.nvtxDomainRangePushEx(self._domain, self._attrs(message))

    def pop(self) -> None:
        self._lib.nvtxDomainRangePop(self._domain)

    def mark(self, message: str) -> None:
        self._lib.nvtxDomainMarkEx(self._domain, self._attrs(message))


def make_emitter(warn: Callable[[str], None]) -> Emitter:
    """The first back end that loads; a silent Emitter (and one warning) when none does."""
    try:
        import nvtx
    except ImportError:
        nvtx = None
    if nvtx is not None:
        try:
            _ungate(nvtx)
        except Exception:  # noqa: BLE001 (a newer nvtx than we know: use it as it is)
            pass
        return _Package(nvtx)
    for path in _c_libraries():
        try:
            return _CApi(ctypes.CDLL(path))
        except (OSError, AttributeError):
            continue
    warn("no NVTX library (pip install nvtx==0.2.11): step, comm and gc labels are off")
    return Emitter()


def _ungate(nvtx: Any) -> None:
    """nvtx >= 0.2.12 under a tool whose injection lacks nvtxDomainIsEnabled: create real domains."""
    if not os.environ.get("NVTX_INJECTION64_PATH"):
        return
    try:
        import nvtx._lib.lib as lib
    except ImportError:
        return
    handle = getattr(lib, "DomainHandle", None)
    if handle is None or not hasattr(handle, "enabled") or handle(DOMAIN).enabled():
        return

    def real_domain(cls: type, name: Any = None) -> Any:
        obj = object.__new__(cls)
        obj.handle = handle(name)
        return obj

    lib.Domain.__new__ = real_domain
    for attr in ("_get_domain_cached", "get_domain"):
        cache_clear = getattr(getattr(nvtx.nvtx, attr, None), "cache_clear", None)
        if cache_clear:
            cache_clear()


def _c_libraries() -> list[str]:
    found = [p for p in (ctypes.util.find_library("nvToolsExt"),) if p]
    found.append("libnvToolsExt.so.1")
    try:
        import nvidia.nvtx  # the nvidia-nvtx-cu12 wheel

        for base in getattr(nvidia.nvtx, "__path__", []):
            found += [str(p) for p in sorted(Path(base, "lib").glob("libnvtx3interop.so*"))]
    except ImportError:
        pass
    return found
