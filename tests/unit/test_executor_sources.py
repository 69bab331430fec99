"""A submitted function's traceback names the user's script on the node, although
cloudpickle (3.1.3 on) pickles the script's code with the file "<dynamic-code>"."""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path

import cloudpickle  # type: ignore[import-untyped]
import pytest
from submitit.core.utils import DelayedSubmission

from hpclaunch.executor import sources

SCRIPT = """
def fail(why):
    raise KeyError(why)

def broken(why):
    return [fail(why) for _ in range(1)]

class Step:
    def __call__(self, why):
        return self.helper(why)

    @staticmethod
    def helper(why):
        fail(why)
"""


def _pickled_by_value(tmp_path: Path, name: str) -> tuple[Path, object]:
    """The module ``user_script`` written to ``tmp_path``, which cloudpickle pickles by
    value as it does a submitting script's ``__main__``."""
    path = tmp_path / "user_script.py"
    path.write_text(SCRIPT)
    spec = importlib.util.spec_from_file_location(f"user_script_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return path, module


def _round_trip(delayed: DelayedSubmission, module_name: str) -> DelayedSubmission:
    raw = cloudpickle.dumps(delayed)
    cloudpickle.unregister_pickle_by_value(sys.modules[module_name])
    del sys.modules[module_name]  # the node has no such module
    loaded: DelayedSubmission = cloudpickle.loads(raw)
    return loaded


def _trace_of(delayed: DelayedSubmission) -> str:
    with pytest.raises(KeyError) as raised:
        delayed.result()
    return "".join(traceback.format_exception(raised.value))


@pytest.mark.parametrize("kind", ["function", "callable object"])
def test_the_trace_names_the_script_and_each_line(tmp_path: Path, kind: str) -> None:
    path, module = _pickled_by_value(tmp_path, kind.replace(" ", "_"))
    function = module.broken if kind == "function" else module.Step()  # type: ignore[attr-defined]
    delayed = DelayedSubmission(function, "lost")
    sources.remember(delayed)
    loaded = _round_trip(delayed, module.__name__)
    sources.restore(loaded)
    trace = _trace_of(loaded)
    assert f'File "{path}", line 3, in fail' in trace, trace
    if kind == "function":
        assert f'File "{path}", line 6, in broken' in trace, trace
    else:
        assert f'File "{path}", line 14, in helper' in trace, trace
    assert sources.DYNAMIC not in trace


def test_a_checkpointed_call_keeps_the_file(tmp_path: Path) -> None:
    path, module = _pickled_by_value(tmp_path, "carried")
    first = DelayedSubmission(module.broken, "x")  # type: ignore[attr-defined]
    sources.remember(first)
    renewed = DelayedSubmission(module.broken, "y")  # type: ignore[attr-defined]
    sources.carry(first, renewed)
    assert getattr(renewed, sources.ATTRIBUTE) == str(path)


def test_code_with_no_file_is_left_alone() -> None:
    delayed = DelayedSubmission(print, "x")
    sources.remember(delayed)
    assert not hasattr(delayed, sources.ATTRIBUTE)
    sources.restore(delayed)  # nothing to do, nothing raised
