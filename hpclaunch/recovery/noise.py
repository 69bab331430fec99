"""torch's known-harmless lines, summarised once in the batch log instead of once per
process (docs/troubleshooting.md explains them). Pure: lines in, a verdict per line and
summary lines out; the supervisor's ``Tee`` (hpclaunch.recovery.stepdeath) applies it to
srun's stderr, where every agent's and (with ``--tee``) every worker's stderr arrives.

Two kinds, seen with torch 2.13 on the sandbox:

* c10d's hostname warning, once from every agent and every worker, when a reverse
  lookup of its own address fails (a node name that only SLURM knows)::

      [rank1] [W1125 04:59:34.112752653 socket.cpp:207] [c10d] The hostname of the
        client socket cannot be retrieved. err=-3   (one line)

* a C++ stack of the rendezvous store (TCPStore) from an agent whose last store request
  found the store's host gone, at the end of a run, as the agents shut down (its one-line
  warning stays in the batch log, where a store that failed mid-run shows too; the
  frames after it are taken)::

      [W1124 11:47:12.143535730 TCPStore.cpp:115] [c10d] recvVector failed on
        SocketImpl(...): Failed to recv, got 0 bytes. ...   (one line)
      Exception raised from recvBytes at .../Utils.hpp:787 (most recent call first):
      frame #0: c10::Error::Error(...) + 0x9d (0x7f6c4c779b8d in .../libc10.so)
      <omitting python frames>
      frame #42: _start + 0x21 (...)
      (a blank line)

The lines taken are not lost: the workers' stay in their rank logs, and the supervisor
writes every line taken into the run's ``torch-noise.log`` (named in the summary).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DOCS = "docs/troubleshooting.md"
_PREFIX = r"(?:\[rank\d+\] ?)?"
_HOSTNAME = re.compile(
    _PREFIX + r"\[W\d{4} [\d:.]+ socket\.cpp:\d+\] \[c10d\] "
    r"(?P<text>The hostname of the client socket cannot be retrieved\. err=-?\d+)\s*"
)
_STORE_HEAD = re.compile(
    _PREFIX + r"\[W\d{4} [\d:.]+ TCPStore\.cpp:\d+\] \[c10d\] "
    r"(?P<call>\w+) failed on SocketImpl\(.*?\): (?P<why>.*?)\s*"
)
_STACK_LINE = re.compile(
    _PREFIX + r"(?:Exception raised from .*|frame #\d+: .*|<omitting python frames>)\s*"
)


@dataclass
class Noise:
    """Counts the known-harmless lines it is shown; ``take`` says which to keep out of
    the batch log."""

    hostname: int = 0
    hostname_text: str = ""
    stacks: int = 0
    stack_text: str = ""
    _in_stack: bool = False

    def take(self, line: str) -> bool:
        """True for a line of the known noise (count it, keep it out of the batch log)."""
        if self._in_stack:
            if _STACK_LINE.fullmatch(line):
                return True
            self._in_stack = False
            if not line.strip():
                return True  # the blank line torch ends the stack with
        hostname = _HOSTNAME.fullmatch(line)
        if hostname is not None:
            self.hostname += 1
            self.hostname_text = self.hostname_text or hostname["text"]
            return True
        head = _STORE_HEAD.fullmatch(line)
        if head is not None:
            self.stacks += 1
            self._in_stack = True
            why = head["why"] if len(head["why"]) <= 60 else head["why"][:57] + "..."
            self.stack_text = self.stack_text or f"{head['call']} failed: {why}"
            return False  # the warning itself stays: mid-run, it may precede a real failure
        return False

    def summary(self, raw: str) -> list[str]:
        """One line per kind seen; ``raw`` names the file that holds the lines taken."""
        lines = []
        if self.hostname:
            lines.append(
                f"torch's c10d warned {self.hostname} time{'s' if self.hostname != 1 else ''} "
                f"(once per agent and worker) that {self.hostname_text!r}: harmless, the node "
                f"names resolve for SLURM but not backwards (see {DOCS}); the raw lines are in "
                f"the rank logs and {raw}"
            )
        if self.stacks:
            lines.append(
                f"torch printed {self.stacks} C++ stack{'s' if self.stacks != 1 else ''} of "
                f"its rendezvous store ({self.stack_text!r}), each after the TCPStore warning "
                f"above: harmless at the end of a run, where an agent's last store request "
                f"finds the store's host gone (see {DOCS}); the frames are in {raw}"
            )
        return lines
