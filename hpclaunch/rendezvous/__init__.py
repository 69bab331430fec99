"""Rendezvous settings and backends for torch's elastic agent (imports torch)."""
