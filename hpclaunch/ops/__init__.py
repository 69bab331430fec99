"""Operating jobs from the login node: what is known of a job, following it, the user's job list."""
