"""Warm worker start: a zygote forked once torch is imported, workers forked from
it, and torch's process context for them (``warm`` imports torch)."""
