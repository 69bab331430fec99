"""etcd's pure parts: access settings, the password's sources, the sidecar's names."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpclaunch.errors import EtcdError
from hpclaunch.rendezvous.etcd.access import PASSWORD_VAR, Access, read_password
from hpclaunch.rendezvous.etcd.sidecar import candidate_ports, member_name, server_argv
from hpclaunch.slurm.env import derive_port


def test_access_checks_its_parts(tmp_path: Path) -> None:
    pem = tmp_path / "c.pem"
    pem.write_text("x")
    path = str(pem)
    ok = Access(("e:1",), cacert=path, cert=path, key=path, user="u", password="hunter2")
    assert ok.tls and "hunter2" not in repr(ok)  # the password never shows
    assert not Access(("e:1",)).tls
    with pytest.raises(EtcdError, match="no etcd endpoint given"):
        Access(())
    with pytest.raises(EtcdError, match="--etcd-cert is given alone"):
        Access(("e:1",), cert=str(pem))
    with pytest.raises(EtcdError, match=f"--etcd-user 'u' has no password.*\\${PASSWORD_VAR}"):
        Access(("e:1",), user="u")
    with pytest.raises(EtcdError, match=r"--etcd-cacert '/nope\.pem' is not a readable file"):
        Access(("e:1",), cacert="/nope.pem")


def test_password_comes_from_the_file_first_then_the_environment(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret with space\nignored\n")
    env = {PASSWORD_VAR: "from-env"}
    assert read_password(env, str(secret)) == "s3cret with space"
    assert read_password(env, None) == "from-env"
    assert read_password({}, None) is None and read_password({PASSWORD_VAR: ""}, None) is None
    with pytest.raises(EtcdError, match="--etcd-password-file '/nope' cannot be read"):
        read_password(env, "/nope")
    (tmp_path / "empty").write_text("")
    with pytest.raises(EtcdError, match="is empty; write the password on its first line"):
        read_password(env, str(tmp_path / "empty"))


def test_sidecar_names_and_ports() -> None:
    assert member_name(1234, 2) == "hpclaunch-1234-2"
    ports = candidate_ports(1234)
    assert ports == [21234, 21235, 21236, 21237]
    assert derive_port(1234) not in ports  # never the job's own c10d port
    assert candidate_ports(4998) == [24998, 24999, 15000, 15001]  # wraps inside the span
    argv = server_argv("/usr/bin/etcd", "hpclaunch-7-0", "10.0.0.1", 20007, Path("/tmp/d"))
    assert argv[:5] == ["/usr/bin/etcd", "--name", "hpclaunch-7-0", "--data-dir", "/tmp/d"]
    assert "http://10.0.0.1:20007" in argv and "--initial-cluster" in argv
    assert "http://[fe80::1]:20007" in server_argv("etcd", "n", "fe80::1", 20007, Path("/d"))
