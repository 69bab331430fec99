"""The job folder as a contract: its paths and file formats. No torch, no SLURM."""
