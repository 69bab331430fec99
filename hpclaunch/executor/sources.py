"""The file a submitted callable was written in, kept across pickling.

cloudpickle (3.1.3 on) pickles the functions and classes of the submitting script
(its ``__main__``) by value with the file name ``"<dynamic-code>"``, so a traceback
on a node reads ``File "<dynamic-code>", line 17, in train`` instead of naming the
user's script. The Executor notes the callable's file before pickling
(``remember``); the worker puts it back into that code after loading (``restore``).
Code pickled by value comes from the script that submitted it, so one file serves
the callable and the functions and classes it uses from there.
"""

from __future__ import annotations

from types import CodeType, FunctionType
from typing import Any

DYNAMIC = "<dynamic-code>"
ATTRIBUTE = "_hpclaunch_source_file"


def source_file(function: Any) -> str | None:
    """The file ``function`` (a function, or an object with ``__call__``) was written
    in; None when it has none (a builtin, code typed at a prompt)."""
    code = getattr(function, "__code__", None)
    if code is None:  # an object: the code of its class's __call__
        owners = [vars(klass) for klass in type(function).__mro__]
        call = next((members["__call__"] for members in owners if "__call__" in members), None)
        code = getattr(call, "__code__", None)
    if isinstance(code, CodeType) and not code.co_filename.startswith("<"):
        return code.co_filename
    return None


def remember(delayed: Any) -> None:
    """Note the file of ``delayed.function`` (a submitit DelayedSubmission) in it."""
    path = source_file(delayed.function)
    if path is not None:
        vars(delayed)[ATTRIBUTE] = path  # an attribute of our pickled call, pickled with it


def carry(old: Any, new: Any) -> None:
    """Keep the noted file when ``checkpoint()`` returns the call the next run makes."""
    path = getattr(old, ATTRIBUTE, None)
    if path is not None and getattr(new, ATTRIBUTE, None) is None:
        vars(new)[ATTRIBUTE] = path


def restore(delayed: Any) -> None:
    """Give the code pickled by value in ``delayed.function`` its file name back."""
    path = getattr(delayed, ATTRIBUTE, None)
    if not isinstance(path, str):
        return
    for function in _dynamic_functions(delayed.function):
        function.__code__ = _renamed(function.__code__, path)


def _dynamic_functions(root: Any) -> list[FunctionType]:
    """The functions reachable from ``root`` whose code has no file: ``root`` itself,
    the methods of its class, and the functions and classes they use by name."""
    found: list[FunctionType] = []
    seen: set[int] = set()
    pending = [root if isinstance(root, (FunctionType, type)) else type(root)]
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, type):
            for klass in item.__mro__:
                pending.extend(_functions_in(vars(klass).values()))
        elif isinstance(item, FunctionType) and item.__code__.co_filename == DYNAMIC:
            found.append(item)
            used = item.__globals__.values()
            pending.extend(value for value in used if isinstance(value, (FunctionType, type)))
    return found


def _functions_in(members: Any) -> list[FunctionType]:
    """The plain functions among a class's members, those under static and class
    methods and properties included."""
    unwrapped: list[Any] = []
    for member in members:
        if isinstance(member, (staticmethod, classmethod)):
            unwrapped.append(member.__func__)
        elif isinstance(member, property):
            unwrapped += [member.fget, member.fset, member.fdel]
        else:
            unwrapped.append(member)
    return [member for member in unwrapped if isinstance(member, FunctionType)]


def _renamed(code: CodeType, path: str) -> CodeType:
    if code.co_filename != DYNAMIC:
        return code
    consts = tuple(_renamed(c, path) if isinstance(c, CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=path, co_consts=consts)
