"""The files a sandbox needs before its daemons start: slurm.conf and its companions,
the daemons' folders, fake GPU device files and munge's key."""

from __future__ import annotations

import os
import subprocess

from hpclaunch.errors import SandboxError
from hpclaunch.sandbox import conf
from hpclaunch.sandbox.conf import Layout


def prepare_files(lay: Layout) -> None:
    """The sandbox's configuration, folders, fake GPU devices and munge key, in its
    state folder. Raises SandboxError."""
    d = lay.state_dir
    for sub in ("etc", "ctld", "run", "log", "dev"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    for node in lay.nodes:
        (d / "spool" / node.name).mkdir(parents=True, exist_ok=True)
    (d / "munge").mkdir(mode=0o700, exist_ok=True)
    (d / "etc" / "slurm.conf").write_text(conf.slurm_conf(lay))
    (d / "etc" / "topology.conf").write_text(conf.topology_conf(lay))
    (d / "etc" / "gres.conf").write_text(conf.gres_conf(lay))
    (d / "etc" / "hosts").write_text(conf.hosts_file(lay))
    for i in range(lay.spec.gpus_per_node):
        device = conf.gpu_device(lay, i)
        if not device.exists():
            try:  # a character device with NVIDIA's major number: GRES binds it like a GPU
                os.mknod(device, 0o600 | 0o020000, os.makedev(195, i))
            except PermissionError:
                raise SandboxError(
                    "cannot create fake GPU device files here (no CAP_MKNOD); use --gpus-per-node 0"
                ) from None
    key = d / "munge" / "munge.key"
    if not key.exists():
        made = subprocess.run(
            ["mungekey", "--create", f"--keyfile={key}"],
            capture_output=True,
            text=True,
            check=False,
        )
        if made.returncode != 0:
            raise SandboxError(f"mungekey could not create {key}: {made.stderr.strip()}")
    key.chmod(0o600)
