"""What the frameworks people already run need under hpclaunch, one module each,
imported by the training script (never by the CLI): ``hpclaunch.frameworks.lightning``.
accelerate needs nothing of ours: the agent sets ``ACCELERATE_USE_CPU=1`` on nodes
without a GPU (hpclaunch.contract.worker_env.framework_env)."""
