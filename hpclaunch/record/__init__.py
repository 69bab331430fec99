"""The job record: a job's folder read once into typed data (``JobRecord.read``), and
what is worked out of it with pure functions: the training's progress, the work each run
lost, the goodput, the restarts and the hangs. ``hpclaunch status``, ``--follow``,
``hpclaunch report``, the supervisor and a lost batch host's deputy all read the folder
through it. No torch, no SLURM."""
