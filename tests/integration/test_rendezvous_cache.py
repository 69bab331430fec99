"""hpclaunch-c10d's state cache, scaled with the job like its delays (imports torch)."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.integration


def test_the_rendezvous_state_cache_scales_with_the_job() -> None:
    with warnings.catch_warnings():  # torch's import warns that numpy is missing
        warnings.simplefilter("ignore")
        from hpclaunch.rendezvous.ranked_c10d import scale_cache

    small, large = SimpleNamespace(_cache_duration=1), SimpleNamespace(_cache_duration=1)
    scale_cache(small, 2)
    scale_cache(large, 400)
    assert small._cache_duration == pytest.approx(0.05)  # a restart seen within ~0.1 s
    assert large._cache_duration == 1  # torch's second, to spare a large job's store
