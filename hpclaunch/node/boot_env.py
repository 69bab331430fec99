"""How a fresh worker gets progress reporting before its script's first line: the agent
puts hpclaunch/node/progress_boot first on its PYTHONPATH, whose ``sitecustomize`` takes
itself out again (``unboot``) and calls hpclaunch.progress.install. No torch."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, MutableMapping

# The fresh workers' boot (hpclaunch/node/progress_boot/sitecustomize.py) rides on
# PYTHONPATH; the value the worker was meant to have is kept here and put back.
SAVED_PYTHONPATH = "HPCLAUNCH_SAVED_PYTHONPATH"
BOOT_FOLDER = os.path.join(os.path.dirname(__file__), "progress_boot")


def boot_env(env: Mapping[str, str]) -> dict[str, str]:
    """What the agent adds to a worker's environment ``env`` so that a fresh python
    installs progress reporting before the script (the boot folder first on PYTHONPATH,
    the value meant kept in SAVED_PYTHONPATH); ``unboot`` in the worker puts it back."""
    meant = env.get("PYTHONPATH")
    parts = [BOOT_FOLDER, meant] if meant else [BOOT_FOLDER]
    return {"PYTHONPATH": os.pathsep.join(parts), SAVED_PYTHONPATH: json.dumps(meant)}


def unboot(environ: MutableMapping[str, str]) -> None:
    """Take the boot folder out of PYTHONPATH again (see ``boot_env``), keeping what a
    launcher in between added; unset when it was unset and nothing else is left."""
    saved = environ.pop(SAVED_PYTHONPATH, None)
    if saved is None:
        return
    parts = environ.get("PYTHONPATH", "").split(os.pathsep)
    if BOOT_FOLDER in parts:
        parts.remove(BOOT_FOLDER)
    if parts == [] and json.loads(saved) is None:
        environ.pop("PYTHONPATH", None)
    else:
        environ["PYTHONPATH"] = os.pathsep.join(parts)
