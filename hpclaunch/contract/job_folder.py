"""The names the rendered script gives the parts of a job's folder that it makes itself
(hpclaunch.jobdir.layout has the whole folder): the login node renders them into the
script without loading the folder's readers and writers."""

from __future__ import annotations

# The checkpoint folder inside the job folder, when the job gives none of its own.
CHECKPOINTS = "checkpoints"
# sbatch's --output, relative to the log folder: SLURM puts the job name for %x and
# the job id for %j, which hpclaunch.jobdir.layout.batch_log spells out.
BATCH_LOG_PATTERN = "%x-%j.out"
