"""What runs inside torch's elastic agent: the ranked c10d rendezvous, per-rank logs,
failure records. Every module here imports torch; only ``hpclaunch.agent.launch`` imports them."""
