"""The public API walk: every public module has an `__all__`, `dir()` lists exactly it, and every
public class, function, method and property in it has a docstring.

Public: what `streamsnap.__all__` and the public modules' `__all__` export. A method overriding
a documented one (a trigger's `on_element`, a sink's `create_writer`) may inherit its
docstring; a class may not (a dataclass's generated "Name(field: type, ...)" does not count).
"""

from __future__ import annotations

import importlib
import inspect
import types

import pytest

PUBLIC_MODULES = ["streamsnap", "streamsnap.sources", "streamsnap.sinks", "streamsnap.state",
                  "streamsnap.windows", "streamsnap.jobs", "streamsnap.testing", "streamsnap.errors"]


def load(name: str) -> types.ModuleType:
    """A public module by the name users write (`streamsnap.sinks` is the attribute `ss.sinks`)."""
    import streamsnap

    if name == "streamsnap":
        return streamsnap
    head, _, rest = name.partition(".")
    if rest in ("sources", "sinks", "jobs"):
        return getattr(streamsnap, rest)
    return importlib.import_module(name)


def public_objects():
    """(qualified name, object) of every exported name, once per object (the first name wins)."""
    seen: set[int] = set()
    for module_name in PUBLIC_MODULES:
        module = load(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            yield f"{module_name}.{name}", obj


def own_docstring(cls: type) -> str:
    doc = (cls.__dict__.get("__doc__") or "").strip()
    generated = doc.startswith(f"{cls.__name__}(")            # dataclasses' "Name(field: type, ...)"
    return "" if generated else doc


def members(cls: type):
    """(name, function or property) of a class's public methods and properties, streamsnap's own."""
    for name in dir(cls):
        if name.startswith("_"):
            continue
        owner = next((k for k in cls.__mro__ if name in k.__dict__), None)
        if owner is None or not owner.__module__.startswith("streamsnap"):
            continue                                           # object's, Exception's, Enum's
        raw = owner.__dict__[name]
        if isinstance(raw, (staticmethod, classmethod)):
            raw = raw.__func__
        if isinstance(raw, property) or inspect.isfunction(raw):
            yield name, getattr(cls, name) if not isinstance(raw, property) else raw


def missing_docstrings() -> list[str]:
    missing = []
    for module_name in PUBLIC_MODULES:
        if not (load(module_name).__doc__ or "").strip():
            missing.append(f"module {module_name}")
    for qualified, obj in public_objects():
        if isinstance(obj, types.ModuleType):
            continue
        if inspect.isclass(obj):
            if not own_docstring(obj):
                missing.append(f"class {qualified}")
            for name, member in members(obj):
                if not (inspect.getdoc(member) or "").strip():
                    missing.append(f"{qualified}.{name}")
        elif callable(obj) and not (inspect.getdoc(obj) or "").strip():
            missing.append(f"function {qualified}")
    return sorted(set(missing))


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_a_public_module_has_an_all_and_dir_lists_exactly_it(module_name):
    module = load(module_name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{module_name} has no __all__: list its public names in one"
    assert len(exported) == len(set(exported)), f"{module_name}.__all__ lists a name twice: {exported}"
    unresolved = [name for name in exported if not hasattr(module, name)]
    assert not unresolved, f"{module_name}.__all__ names {unresolved}, which the module does not define"
    listed = {name for name in dir(module) if not name.startswith("_")}
    assert listed == set(exported), (
        f"dir({module_name}) and its __all__ differ: only in dir(): {sorted(listed - set(exported))}, "
        f"only in __all__: {sorted(set(exported) - listed)}; give the module "
        f"`def __dir__(): return sorted(__all__)` and keep __all__ to the public names")


def test_the_modules_leak_none_of_their_imports():
    import streamsnap as ss

    for leaked in ("json", "sys", "threading", "logging"):
        assert leaked not in dir(ss.sinks)
    assert {"read", "metadata", "bootstrap", "SavepointWriter"} <= set(dir(ss.state))
    assert "HashMapKeyedStateBackend" not in dir(ss.state) and "api" not in dir(ss)


def test_every_public_name_has_a_docstring():
    missing = missing_docstrings()
    assert not missing, (f"{len(missing)} public name(s) without a docstring — write one saying what it "
                         f"does, with types, units and an example where useful:\n  " + "\n  ".join(missing))


def test_the_walk_finds_a_missing_docstring():
    """The walk itself: a public class whose method lost its docstring is reported."""
    import streamsnap as ss

    def status(self) -> str:
        return "RUNNING"

    original = ss.JobClient.__dict__["status"]
    ss.JobClient.status = status
    try:
        assert "streamsnap.JobClient.status" in missing_docstrings()
    finally:
        ss.JobClient.status = original
    assert "streamsnap.JobClient.status" not in missing_docstrings()
