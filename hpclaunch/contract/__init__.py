"""The ground floor's contracts: what the parts of hpclaunch that run in different
places (the login node, the batch step, each node's agent, the workers) agree on.

* ``worker_env``: the names of the variables the script and the agent set for the
  workers, and the job folder's default place;
* ``table``: the settings-table machinery, one row per option of a command the
  script runs;
* ``agent`` and ``supervisor``: the settings of ``hpclaunch agent`` and
  ``hpclaunch supervise``, written into the script and parsed back on the nodes;
* ``rendezvous``: the rendezvous settings of a job, by backend;
* ``values``: the values those settings carry, and their parsers.

Pure: no torch, no click, no I/O. Modules here import nothing of hpclaunch but
``hpclaunch.errors`` and each other (tests/unit/test_layout.py).
"""
