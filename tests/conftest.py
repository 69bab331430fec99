"""Shared pytest set-up: ``--fail-on-skip`` turns every skip into a failure.

CI installs what every tier needs, so a test that skips there hides a gap.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator

import pytest

pytest_plugins = ["pytester"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fail-on-skip",
        action="store_true",
        help="report skipped tests as failures (CI installs every tier's needs)",
    )
    parser.addoption(
        "--gpu",
        action="store_true",
        help="also run the tests marked gpu (they need CUDA; without --gpu they are deselected)",
    )
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite golden files (examples/sbatch/*/job.sbatch) from the current renderer",
    )


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep each module's tests on one pytest-xdist worker (scripts/test runs several
    with --dist loadgroup) unless the module names a group shared with other modules:
    its tests share module fixtures (a training job, an uninterrupted reference run) that
    a second worker would repeat. Then deselect (not skip) the gpu tests unless --gpu:
    CPU-only CI never sees them."""
    for item in items:
        if not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    if config.getoption("--gpu"):
        return
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The process's umask 000 for the test (what a user's shell may have), then back."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """True when golden files should be rewritten instead of compared."""
    return bool(request.config.getoption("--update-golden"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and item.config.getoption("--fail-on-skip"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped with --fail-on-skip: {reason}"
