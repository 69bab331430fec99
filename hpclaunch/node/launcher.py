"""The launch hpclaunch owns: torch's LaunchConfig -> rendezvous handler -> WorkerSpec
-> RecordingAgent, run until the workers succeed or fail for good (imports torch).

This is torch 2.13's ``launch_agent`` (torch.distributed.launcher.api), owned so that
the agent is hpclaunch's subclass, built with its callbacks and its process context
rather than found by torch in its module. What torch does there and hpclaunch relies
on is kept: events and metrics, a ChildFailedError with the failures when the workers
fail for good, and the rendezvous shut down in the end unless a signal stopped the
agent (the other nodes' agents may still scale). The first import of torch's elastic
internals on the agent's launch path is here, after the version check.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from typing import Any

import torch

from hpclaunch.node.torch_version import check_torch_version

check_torch_version(torch.__version__)  # before torch's internals below are imported

# ruff: noqa: E402 (imported after the check, on purpose)
from torch.distributed import DistNetworkError
from torch.distributed.elastic import events, metrics
from torch.distributed.elastic.agent.server.api import WorkerSpec
from torch.distributed.elastic.metrics.api import MetricsConfig
from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing import start_processes as torch_start_processes
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousParameters,
)
from torch.distributed.elastic.rendezvous import registry as rdzv_registry
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
from torch.distributed.launcher.api import LaunchConfig

from hpclaunch.node.hangs import Watch
from hpclaunch.node.recording_agent import OnFailure, RecordingAgent, StartProcesses, WorkerEnv
from hpclaunch.node.sweep import Sweeper

# What the caller catches and builds, from torch, so that it imports torch through here.
__all__ = [
    "ChildFailedError",
    "DistNetworkError",
    "LaunchConfig",
    "RendezvousClosedError",
    "RendezvousError",
    "SignalException",
    "run_agent",
]


def run_agent(
    config: LaunchConfig,
    entrypoint: str,
    args: Sequence[str],
    *,
    worker_env: WorkerEnv,
    on_failure: OnFailure | None = None,
    monitor_wait_s: float = 0.1,
    start_processes: StartProcesses | None = None,
    sweeper: Sweeper | None = None,
    hangs: Watch | None = None,
) -> dict[int, Any]:
    """Run the workers (``entrypoint args``) under hpclaunch's agent; their return values.

    ``worker_env(attempt)`` is added to each worker's environment; ``on_failure(result,
    attempt)`` runs after each failed attempt; ``start_processes`` makes the workers'
    process context (None: torch's own); ``sweeper`` ends what the workers leave
    running each time their group stops, ``hangs`` watches their progress (see
    RecordingAgent). Raises ChildFailedError
    when the workers failed for good, SignalException when the agent was stopped by a
    signal, and what the rendezvous raises (RendezvousError and its kinds)."""
    params = RendezvousParameters(
        backend=config.rdzv_backend,
        endpoint=config.rdzv_endpoint,
        run_id=config.run_id,
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        local_addr=config.local_addr,
        **config.rdzv_configs,
    )
    master_addr, master_port = static_master(params)
    spec = WorkerSpec(
        role=config.role,
        local_world_size=config.nproc_per_node,
        entrypoint=entrypoint,
        args=tuple(args),
        rdzv_handler=rdzv_registry.get_rendezvous_handler(params),
        max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval,
        master_addr=master_addr,
        master_port=master_port,
        local_addr=config.local_addr,
        event_log_handler=config.event_log_handler,
        numa_options=config.numa_options,
        duplicate_stdout_filters=config.duplicate_stdout_filters,
        duplicate_stderr_filters=config.duplicate_stderr_filters,
        virtual_local_rank=config.virtual_local_rank,
    )
    agent = RecordingAgent(
        spec,
        config.logs_specs,  # type: ignore[arg-type]
        worker_env=worker_env,
        signals=signals_of(config.signals_to_handle),
        on_failure=on_failure,
        monitor_wait_s=monitor_wait_s,
        start_processes=start_processes or torch_start_processes,
        sweeper=sweeper,
        hangs=hangs,
        start_method=config.start_method,
        shutdown_timeout=config.shutdown_timeout,
        log_line_prefix_template=config.log_line_prefix_template,
    )
    shutdown_rdzv = True
    try:
        metrics.initialize_metrics(MetricsConfig(config.metrics_cfg))
        result = agent.run()
        events.record(agent.get_event_succeeded(), config.event_log_handler)
        if result.is_failed():
            raise ChildFailedError(name=entrypoint_name(entrypoint, args), failures=result.failures)
        return result.return_values
    except ChildFailedError:
        raise
    except SignalException:
        # Shutting the rendezvous down would close it for good, for every node.
        shutdown_rdzv = False
        events.record(agent.get_event_failed(), config.event_log_handler)
        raise
    except Exception:
        events.record(agent.get_event_failed(), config.event_log_handler)
        raise
    finally:
        if shutdown_rdzv:
            spec.rdzv_handler.shutdown()


def static_master(params: RendezvousParameters) -> tuple[str | None, int | None]:
    """The workers' master address and port: static rendezvous fixes them (its
    endpoint), the dynamic ones find them. Raises ValueError without a port."""
    if params.backend != "static":
        return None, None
    endpoint = params.endpoint.strip()
    if not endpoint:
        raise ValueError(
            "static rendezvous needs an endpoint; pass --master-addr and --master-port"
        )
    addr, port = parse_rendezvous_endpoint(endpoint, default_port=-1)
    if port == -1:
        raise ValueError(f"port is missing in endpoint {endpoint!r}; pass --master-port")
    return addr, port


def signals_of(names: str) -> list[signal.Signals]:
    """``SIGTERM,SIGUSR1`` -> the signals (torch's ``signals_to_handle`` format)."""
    return [signal.Signals[name.strip()] for name in names.split(",") if name.strip()]


def entrypoint_name(entrypoint: str, args: Sequence[str]) -> str:
    """What torch calls the workers in its errors: the script of a python command line."""
    if entrypoint == sys.executable:
        return next((arg for arg in args if not arg.startswith("-")), "")
    return entrypoint
