"""``python -m hpclaunch``: the same as the ``hpclaunch`` command."""

from hpclaunch.cli import main

main(prog_name="hpclaunch")
