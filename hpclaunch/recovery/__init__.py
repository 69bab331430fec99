"""The batch step: the supervisor and its pure requeue policy."""
