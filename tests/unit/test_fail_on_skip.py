"""--fail-on-skip, which CI uses, turns a skipped test into a failure."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = Path(__file__).parents[1] / "conftest.py"


def test_skip_fails_only_with_the_flag(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.read_text().replace('pytest_plugins = ["pytester"]', ""))
    pytester.makepyfile("import pytest\n\ndef test_needs_x():\n    pytest.skip('x is missing')\n")
    pytester.runpytest().assert_outcomes(skipped=1)
    strict = pytester.runpytest("--fail-on-skip")
    strict.assert_outcomes(failed=1)
    strict.stdout.fnmatch_lines(["*skipped with --fail-on-skip*x is missing*"])
