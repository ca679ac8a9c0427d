"""perfdoctor's capture hook: this folder is put first on PYTHONPATH by ``perfdoctor capture`` only.

Python imports ``sitecustomize`` at start-up, so this runs in every Python process of the captured
run (the launcher, each rank, data-loader workers). It does two things and never raises:

1. runs the ``sitecustomize`` it shadows (a distribution's or a container's), so their set-up stays;
2. when ``PERFDOCTOR_RUN_DIR`` is set, installs the hook (``perfdoctor.capture.hook.runtime``), which
   patches nothing until torch is imported and labels nothing until the process is a training rank.

Without ``PERFDOCTOR_RUN_DIR`` it does nothing else.
"""

import os
import sys


def _chain_shadowed() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    mine = globals()
    for name, value in vars(module).items():  # `import sitecustomize; sitecustomize.X` keeps working
        if not name.startswith("_") and name not in mine:
            mine[name] = value


def _start_hook() -> None:
    if not os.environ.get("PERFDOCTOR_RUN_DIR"):
        return
    started = os.environ.get("PERFDOCTOR_STARTED_FILE")
    if started:
        open(started, "a").close()  # tells the launcher the program started (nsys did not fail first)
    try:
        from perfdoctor.capture.hook import runtime
    except ImportError:
        package_root = os.environ.get("PERFDOCTOR_PACKAGE_ROOT")
        if not package_root:
            raise
        sys.path.append(package_root)  # this interpreter lacks perfdoctor: use the launcher's copy
        try:
            from perfdoctor.capture.hook import runtime
        finally:
            sys.path.remove(package_root)
    runtime.install()


for _step in (_chain_shadowed, _start_hook):
    try:
        _step()
    except Exception as _exc:  # noqa: BLE001 (a training run must never fail because of its profiler)
        sys.stderr.write(f"perfdoctor capture hook: {_step.__name__} failed ({type(_exc).__name__}: {_exc})\n")
