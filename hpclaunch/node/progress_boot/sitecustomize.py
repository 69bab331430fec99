"""A fresh worker's start-up hook: python imports ``sitecustomize`` from PYTHONPATH at
start, and the agent puts this folder first there (hpclaunch.node.boot_env). It
takes itself out of sys.path and PYTHONPATH again, runs the ``sitecustomize`` that would
have run without it, then installs progress reporting (hpclaunch.progress.install),
before the script's first line. A worker that cannot import hpclaunch runs as it is."""

import importlib
import json
import os
import sys
from typing import Any


def _boot() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if not p or os.path.abspath(p) != here]
    me = sys.modules.pop("sitecustomize")
    progress: Any = None
    try:
        from hpclaunch import progress
        from hpclaunch.node import boot_env
    except Exception:  # another interpreter, or hpclaunch not importable: run as is
        saved = json.loads(os.environ.pop("HPCLAUNCH_SAVED_PYTHONPATH", "null"))
        os.environ.pop("PYTHONPATH", None)
        if saved is not None:
            os.environ["PYTHONPATH"] = saved
    else:
        boot_env.unboot(os.environ)
    try:
        importlib.import_module("sitecustomize")  # the one that would have run
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
        sys.modules["sitecustomize"] = me  # importlib takes its own entry back out
    if progress is not None:
        progress.install(os.environ)


_boot()
