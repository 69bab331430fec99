"""Talking to SLURM (the one command runner, submission) and reading what it
exports (a node's view of the job, hostlists). Never imports torch."""
