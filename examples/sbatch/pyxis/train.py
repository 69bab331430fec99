"""A placeholder for your training script: hpclaunch checks that it exists."""

import os

print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}")
