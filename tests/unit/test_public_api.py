"""The public facade: what `import hpclaunch` offers is pinned here."""

from __future__ import annotations

import hpclaunch


def test_all_is_pinned() -> None:
    assert sorted(hpclaunch.__all__) == [
        "C10dRdzv",
        "ConfigError",
        "EntryKind",
        "EtcdRdzv",
        "Executor",
        "ExecutorError",
        "GpuDirective",
        "HpclaunchError",
        "Job",
        "JobSpec",
        "NodeRange",
        "Rendezvous",
        "SlurmError",
        "SlurmNotFound",
        "SpecError",
        "StaticRdzv",
        "TemplateError",
        "__version__",
    ]
    for name in hpclaunch.__all__:
        assert hasattr(hpclaunch, name), name
