"""The torch releases hpclaunch's agent is tested against, and the check that refuses
others (pure: no torch; ``hpclaunch.node.launcher`` runs it as it is imported).

The agent drives torch's elastic agent through parts that are not torch's public API
(its worker start, the rendezvous handler's join, the process contexts), and these
change between releases: a torch outside the tested range would fail deep inside a
running job, so it is refused at the start, with the fix. pyproject.toml pins the
same range.
"""

from __future__ import annotations

import re

from hpclaunch.errors import HpclaunchError

# [LOWEST, BELOW): the (major, minor) releases the agent is tested against.
LOWEST_TESTED = (2, 13)
BELOW_TESTED = (2, 14)
TESTED_RANGE = ">={}.{},<{}.{}".format(*LOWEST_TESTED, *BELOW_TESTED)


class TorchVersionError(HpclaunchError):
    """The installed torch is not one the agent is tested against."""


def release_of(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string (``2.13.0+cpu`` -> (2, 13)), or None."""
    match = re.match(r"\s*(\d+)\.(\d+)", version)
    return None if match is None else (int(match[1]), int(match[2]))


def check_installed_torch() -> None:
    """Refuse an installed torch outside the tested range, read from its package
    metadata (importing torch here would load OpenBLAS's threads before the warm start
    forks). Raises TorchVersionError, also when torch is not installed."""
    from importlib import metadata

    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        raise TorchVersionError(
            "torch is not installed where the agent runs; install it in the job's "
            f"environment (pip install 'torch{TESTED_RANGE}')"
        ) from None
    check_torch_version(version)


def check_torch_version(version: str) -> None:
    """Refuse a torch outside the tested range. ``version``: ``torch.__version__``.

    Raises TorchVersionError naming the installed version, the tested range and the fix."""
    release = release_of(version)
    if release is not None and LOWEST_TESTED <= release < BELOW_TESTED:
        return
    raise TorchVersionError(
        f"torch {version} is installed (torch.__version__), but hpclaunch's agent is "
        f"tested against torch{TESTED_RANGE} only: it drives torch's elastic agent "
        "through internals that change between releases. Install a tested torch in the "
        f"job's environment (pip install 'torch{TESTED_RANGE}'), or an hpclaunch release "
        f"tested against torch {version}"
    )
