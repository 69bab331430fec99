"""Rendezvous time as nodes grow: torch's c10d, hpclaunch-c10d and hpclaunch-etcd.

A benchmark, not a test. Each "node" is a process on this machine that imports
torch and creates its agent's rendezvous handler through torch's registry, as
the elastic agent does, then waits for a go. All but the last join at once;
the last joins 5 s later (``--last-join-delay``), when the others are waiting.
The figure is the time from the last node's join to the moment every node holds the completed round
(the latest ``next_rendezvous`` return, all clocks of this machine). No workers
are started: what is measured is the rendezvous alone, so the workers are as
cheap as can be.

* ``c10d``: torch's own backend, which polls the state once a second;
* ``hpclaunch-c10d``: hpclaunch's c10d handler, polls scaled with the job size;
* ``hpclaunch-etcd``: the etcd v3 backend, which watches the state key (a local
  etcd on loopback, election settings as for the sidecar).

    .venv/bin/python bench/rendezvous.py [--nodes 4,8,16,32] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time

from hpclaunch.rendezvous.etcd.sidecar import Sidecar

BACKENDS = ("c10d", "hpclaunch-c10d", "hpclaunch-etcd")
LAST_JOIN_DELAY_S = 5.0

# One node: create the handler, say ready, wait for "go", rendezvous, report.
NODE = """
import json, sys, time
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
from hpclaunch.rendezvous import etcd_rdzv, ranked_c10d
ranked_c10d.register()
etcd_rdzv.register()
backend, endpoint, run_id, nodes, rank = sys.argv[1:6]
nodes, rank = int(nodes), int(rank)
configs = {"join_timeout": 120, "last_call_timeout": 1}
if backend == "c10d":
    configs["is_host"] = rank == 0
elif backend == "hpclaunch-c10d":
    configs.update(node_rank=rank, is_host=rank == 0)
else:
    configs["node_rank"] = rank
params = RendezvousParameters(backend, endpoint, run_id, nodes, nodes, **configs)
handler = get_rendezvous_handler(params)
print("ready", flush=True)
sys.stdin.readline()
joined = time.time()
info = handler.next_rendezvous()
done = time.time()
print(json.dumps({"rank": info.rank, "joined": joined, "done": done}), flush=True)
sys.stdin.readline()  # stay in the rendezvous until every node is done
handler.shutdown()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def one_run(backend: str, endpoint: str, nodes: int, run_id: str, delay_s: float) -> float:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", NODE, backend, endpoint, run_id, str(nodes), str(rank)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for rank in range(nodes)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a {backend} node did not start")
        for proc in procs[:-1]:
            _say(proc, "go")
        time.sleep(delay_s)  # the others are waiting for the last one now
        _say(procs[-1], "go")
        reports = [json.loads(proc.stdout.readline()) for proc in procs if proc.stdout]
        for proc in procs:
            _say(proc, "end")
            proc.wait(timeout=60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if sorted(r["rank"] for r in reports) != list(range(nodes)):
        raise RuntimeError(f"{backend}: ranks {sorted(r['rank'] for r in reports)}")
    last_join = max(r["joined"] for r in reports)
    return float(max(r["done"] for r in reports) - last_join)


def _say(proc: subprocess.Popen[str], word: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(word + "\n")
    proc.stdin.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="4,8,16,32")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument(
        "--last-join-delay",
        type=float,
        default=LAST_JOIN_DELAY_S,
        help="seconds between the others' join and the last one's",
    )
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    etcd = Sidecar.start(None, "hpclaunch-bench", "127.0.0.1", [free_port()])
    try:
        backends = args.backends.split(",")
        print(f"{'nodes':>5}  " + "  ".join(f"{b:>15}" for b in backends))
        for nodes in sizes:
            medians = []
            for backend in backends:
                etcd_rdzv = backend == "hpclaunch-etcd"
                endpoint = etcd.endpoint if etcd_rdzv else f"127.0.0.1:{free_port()}"
                times = [
                    one_run(
                        backend,
                        endpoint,
                        nodes,
                        f"bench-{nodes}-{run}-{time.time_ns()}",
                        args.last_join_delay,
                    )
                    for run in range(args.runs)
                ]
                medians.append(statistics.median(times))
            print(f"{nodes:>5}  " + "  ".join(f"{m:>13.3f} s" for m in medians), flush=True)
    finally:
        etcd.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
