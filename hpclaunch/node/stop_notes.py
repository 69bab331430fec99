"""Workers that died of a stop signal itself: they do not catch it, so they saved
nothing on it (Python does not catch SIGUSR1 unless told to, nor does Lightning under
torch's elastic environment). The agent says so in the batch log and notes it for
``hpclaunch status`` (hpclaunch.node.agent.after_run). No torch."""

from __future__ import annotations

import logging
import signal
from collections.abc import Mapping

log = logging.getLogger(__name__)

_killers: list[signal.Signals] = []  # stop signals that killed workers outright


def killed_by(sig: signal.Signals, codes: Mapping[int, int]) -> None:
    """Given the exit codes of a node's workers (local rank -> returncode) after stop
    signal ``sig``, say so when some died of it."""
    killed = sorted(rank for rank, code in codes.items() if code == -int(sig))
    if not killed:
        return
    _killers.append(sig)
    log.warning(
        "local ranks %s were killed by %s: they do not catch it, so they saved nothing on it; "
        "a requeued run resumes from the last checkpoint there is, if any. Catch it: "
        "hpclaunch.checkpoint.Preemption, or for Lightning "
        "hpclaunch.frameworks.lightning.StopCheckpoint (docs/bring-your-script.md)",
        ",".join(map(str, killed)),
        sig.name,
    )


def uncaught() -> signal.Signals | None:
    """The stop signal that killed workers that do not catch it, if one did."""
    return _killers[0] if _killers else None
