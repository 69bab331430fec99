"""The sandbox: a real multi-node SLURM cluster on one machine.

``hpclaunch sandbox up|down|status|env`` and the fault injections are thin
commands over ``hpclaunch.sandbox.cluster.Sandbox``.
"""
