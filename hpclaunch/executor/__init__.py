"""The Python API: submit hpclaunch jobs from Python, through submitit.

    executor = hpclaunch.Executor("runs/sweep", nodes=2, nproc_per_node=4, time="01:00:00")
    job = executor.submit(train, lr=3e-4)
    print(job.result())  # global rank 0's return value

See docs/python-api.md. Importing this package imports submitit, never torch.
"""

from hpclaunch.executor.api import Executor, ExecutorError, run_script
from hpclaunch.executor.jobs import Job, LocalJob
from hpclaunch.executor.params import ParameterError

__all__ = ["Executor", "ExecutorError", "Job", "LocalJob", "ParameterError", "run_script"]
