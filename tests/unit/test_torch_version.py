"""The agent's torch version check, as a pure function of the version string."""

from __future__ import annotations

import pytest

from hpclaunch.errors import HpclaunchError
from hpclaunch.node.torch_version import (
    TESTED_RANGE,
    TorchVersionError,
    check_torch_version,
    release_of,
)


@pytest.mark.parametrize("version", ["2.13.0", "2.13.0+cpu", "2.13.1+cu128", "2.13.0rc1"])
def test_a_tested_torch_passes(version: str) -> None:
    check_torch_version(version)


@pytest.mark.parametrize("version", ["2.3.0", "2.12.1+cpu", "2.14.0", "2.14.0a0+git", "3.0.0"])
def test_an_untested_torch_is_refused_with_the_fix(version: str) -> None:
    with pytest.raises(TorchVersionError) as caught:
        check_torch_version(version)
    message = str(caught.value)
    assert f"torch {version} is installed" in message  # the value and its source
    assert TESTED_RANGE == ">=2.13,<2.14"
    assert f"pip install 'torch{TESTED_RANGE}'" in message  # the fix
    assert isinstance(caught.value, HpclaunchError)


def test_an_unreadable_version_is_refused() -> None:
    assert release_of("nightly") is None
    with pytest.raises(TorchVersionError, match="torch nightly is installed"):
        check_torch_version("nightly")


def test_release_of_reads_major_and_minor() -> None:
    assert release_of("2.13.0+cpu") == (2, 13)
    assert release_of("10.2") == (10, 2)


def test_pyproject_pins_the_tested_range() -> None:
    from pathlib import Path

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

    pyproject = Path(__file__).parents[2] / "pyproject.toml"
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    assert f"torch{TESTED_RANGE}" in deps
