"""The login node's part, pure: what the user asked for (the spec, its values,
profiles) and the sbatch script rendered from it. Never imports torch."""
