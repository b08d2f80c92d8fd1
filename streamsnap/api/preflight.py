"""Checks `execute()` runs before any Spark job, so environment mistakes fail in seconds, named.

Without them each mistake surfaces late and disguised: an unwritable checkpoint directory only
after every checkpoint failed (and as advice to raise `tolerable_failures`), a function that
captures a lock as "Could not serialize object" without the operator, executors that cannot
import streamsnap as "Could not recover from a failed barrier ResultStage".

* **Directories** — the checkpoint directory (and a savepoint's target when a savepoint is
  triggered) is created, a probe file written and deleted; a failure names the path and the
  OS error.
* **Pickling** — every operator (user function, source, sink) is pickled once with PySpark's
  cloudpickle, as Spark will; a failure names the operator and the captured object that
  cannot be pickled (e.g. a `threading.Lock`), found by walking closures and attributes.
* **Executors** — with a SparkSession the user passed in, a tiny Spark job checks that the
  executors' Python imports streamsnap. If it cannot, streamsnap ships itself
  (`SparkContext.addPyFile` of a zip of the installed package) and checks again; if that is not
  enough (missing dependencies, another Python version), the error says what to install or set
  (`PYSPARK_PYTHON`, `spark.submit.pyFiles`). Once per SparkContext.
* **Sink output** — sinks with an existing-output policy (`FileSink(mode=...)`) check it here,
  knowing whether the job resumes from a checkpoint.
* **External systems** — a source or sink with a `preflight(label)` method checks what it
  needs outside the job (the Kafka ones: the bootstrap servers answer, the topics exist) and
  raises a PreflightError naming it.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import shutil
import sys
import tempfile
import threading
import types
import uuid
import zipfile

from streamsnap.checkpoint import filesystem
from streamsnap.errors import PreflightError

log = logging.getLogger(__name__)

_verified_contexts: set[str] = set()
_verified_lock = threading.Lock()


# ===================================================================== directories
def check_directory(url: str, what: str, setting: str) -> None:
    """Create `url`, write a probe file into it and delete it; PreflightError naming the path."""
    shown = filesystem.user_path(url)
    probe = filesystem.join(url, f".streamsnap-probe-{uuid.uuid4().hex[:12]}")
    step = "create it"
    try:
        filesystem.makedirs(url)
        step = "write a file into it"
        with filesystem.open_write(probe) as out:
            out.write(b"streamsnap write probe\n")
        step = "delete a file from it"
        filesystem.delete(probe)
    except Exception as exc:
        store = ("" if filesystem.has_directories(url) else
                 " — on an object store: the bucket exists, and CheckpointConfig.storage_options name its "
                 "endpoint and credentials")
        raise PreflightError(
            f"{what} {shown!r} is not usable: could not {step} ({type(exc).__name__}: {exc}). Fix: make it "
            f"writable for this process (and, on a cluster, for every executor){store}, or choose another one "
            f"with {setting}") from exc


# ===================================================================== pickling
def _cloudpickle():
    from pyspark import cloudpickle

    return cloudpickle


def check_picklable(label: str, obj) -> None:
    """Pickle `obj` as Spark will; PreflightError naming `label` and the captured culprit."""
    cloudpickle = _cloudpickle()
    try:
        cloudpickle.dumps(obj)
    except Exception as exc:
        found = _culprit(obj, "", set(), 0, cloudpickle)
        path, culprit = found if found is not None else ("", obj)
        kind = f"{type(culprit).__module__}.{type(culprit).__qualname__}".replace("builtins.", "")
        where = f" captures {path.lstrip(' →')} (a {kind})" if path else f" is a {kind}"
        raise PreflightError(
            f"{label} cannot be shipped to the Spark executors: it{where}, which cannot be pickled "
            f"({type(exc).__name__}: {exc}). Fix: create such objects per subtask in the function's "
            f"open() (or lazily on first use) instead of capturing them, or pass only picklable "
            f"settings (paths, numbers) and build the object from them there") from exc


def _children(obj) -> list[tuple[str, object]]:
    """What pickling `obj` pickles too, each with a readable name."""
    out: list[tuple[str, object]] = []
    if isinstance(obj, types.FunctionType):
        code = obj.__code__
        for name, cell in zip(code.co_freevars, obj.__closure__ or ()):
            try:
                out.append((f" → closure variable '{name}'", cell.cell_contents))
            except ValueError:  # an empty cell (a variable not yet assigned) pickles as empty
                continue
        names = set(code.co_names)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                names.update(const.co_names)
        for name in sorted(names):
            if name in obj.__globals__ and not isinstance(obj.__globals__[name], types.ModuleType):
                out.append((f" → global '{name}'", obj.__globals__[name]))
        out += [(f" → default argument {i}", v) for i, v in enumerate(obj.__defaults__ or ())]
        out += [(f" → default argument '{k}'", v) for k, v in (obj.__kwdefaults__ or {}).items()]
    elif isinstance(obj, types.MethodType):
        out += [(" → bound object", obj.__self__), (" → method", obj.__func__)]
    elif isinstance(obj, functools.partial):
        out += [(" → partial function", obj.func)]
        out += [(f" → partial argument {i}", v) for i, v in enumerate(obj.args)]
        out += [(f" → partial argument '{k}'", v) for k, v in obj.keywords.items()]
    elif isinstance(obj, dict):
        out += [(f"[{k!r}]", v) for k, v in obj.items()]
    elif isinstance(obj, (list, tuple, set, frozenset)):
        out += [(f"[{i}]", v) for i, v in enumerate(obj)]
    else:
        state = getattr(obj, "__dict__", None)
        if isinstance(state, dict):
            out += [(f" → attribute '{k}'", v) for k, v in state.items()]
        for slot in getattr(type(obj), "__slots__", ()) or ():
            if isinstance(slot, str) and hasattr(obj, slot):
                out.append((f" → attribute '{slot}'", getattr(obj, slot)))
    return out


def _culprit(obj, path: str, seen: set, depth: int, cloudpickle):
    """(path, object) of the innermost part of `obj` that cannot be pickled, or None."""
    if depth > 8 or id(obj) in seen:
        return None
    seen.add(id(obj))
    for name, child in _children(obj):
        try:
            cloudpickle.dumps(child)
        except Exception:
            deeper = _culprit(child, path + name, seen, depth + 1, cloudpickle)
            return deeper if deeper is not None else (path + name, child)
    return None


def _operator_label(node) -> str:
    kind = {"source": "source", "sink": "sink"}.get(node.kind.value, "operator")
    return f"{kind} '{node.name}' (uid {node.uid!r})"


# ===================================================================== executors
def _probe_functions():
    """Probes defined outside any importable module, so cloudpickle ships them by value: they
    must run on executors that cannot import streamsnap. `probe` for an RDD partition (classic),
    `arrow_probe` for `mapInArrow` (Spark Connect has no RDDs)."""
    namespace = {"__name__": "__streamsnap_probe__"}
    exec(  # noqa: S102 - fixed source, no user input
        "def probe(_):\n"
        "    import sys\n"
        "    try:\n"
        "        import streamsnap\n"
        "        found = '%s %s' % (streamsnap.__version__, streamsnap.__file__)\n"
        "        return [('ok', found, sys.executable, '%d.%d' % sys.version_info[:2])]\n"
        "    except Exception as exc:\n"
        "        return [('missing', '%s: %s' % (type(exc).__name__, exc), sys.executable,\n"
        "                 '%d.%d' % sys.version_info[:2])]\n"
        "def arrow_probe(batches):\n"
        "    import pyarrow as pa\n"
        "    for _ in batches:\n"
        "        pass\n"
        "    rows = probe(None)\n"
        "    yield pa.RecordBatch.from_arrays([pa.array([str(r[i]) for r in rows]) for i in range(4)],\n"
        "                                     names=['status', 'error', 'executable', 'version'])\n", namespace)
    return namespace["probe"], namespace["arrow_probe"]


def probe_executors(bridge) -> list[tuple]:
    """(status, detail, python executable, python version) from two tasks — detail: the error,
    or "<streamsnap version> <its __init__ path>" — executors share one setup as a rule, and
    every task more is a Python worker to start (seconds on a busy host)."""
    n = max(1, min(bridge.default_parallelism() or 2, 2))
    return bridge.run_probe(*_probe_functions(), n)


def package_zip(directory: str | None = None) -> str:
    """A zip of the installed streamsnap package (top-level `streamsnap/`), for addPyFile.

    Without `directory`, the zip goes to a temporary directory that is deleted when this
    process exits: Spark serves the file from its path for as long as the context lives."""
    import streamsnap

    package = os.path.dirname(os.path.abspath(streamsnap.__file__))
    if directory is None:
        directory = tempfile.mkdtemp(prefix="streamsnap-ship-")
        atexit.register(shutil.rmtree, directory, True)
    target = os.path.join(directory, "streamsnap.zip")
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for root, dirs, files in os.walk(package):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if name.endswith((".pyc", ".pyo")):
                    continue
                path = os.path.join(root, name)
                archive.write(path, os.path.join("streamsnap", os.path.relpath(path, package)))
    return target


def check_executors(spark) -> None:
    """Make sure the executors' Python imports streamsnap (shipping it if needed), once per
    application (classic session) or Connect session."""
    from streamsnap.cluster.spark_bridge import bridge_for
    from streamsnap.cluster.spark_session import executor_python_fix

    bridge = bridge_for(spark)
    key = bridge.identity
    with _verified_lock:
        if key in _verified_contexts:
            return
    results = probe_executors(bridge)
    shipped = how = None
    if any(status != "ok" for status, *_ in results):
        first = next(r for r in results if r[0] != "ok")
        log.warning("executors cannot import streamsnap (%s, Python %s at %s); shipping the package to them",
                    first[1], first[3], first[2])
        shipped = package_zip()
        how = bridge.ship(shipped)
        results = probe_executors(bridge)
    failed = [r for r in results if r[0] != "ok"]
    if failed:
        _, error, executable, version = failed[0]
        driver = "%d.%d" % sys.version_info[:2]
        mismatch = (f" Their Python is {version}, the driver's is {driver}: they must be the same minor "
                    f"version." if version != driver else "")
        raise PreflightError(
            f"the Spark executors cannot import streamsnap, even after it was shipped to them with "
            f"{how}({shipped!r}): {error} (executor Python {version} at {executable}, started "
            f"as {bridge.python or 'python3'!r}).{mismatch} "
            f"Fix: install streamsnap and its dependencies (pip install streamsnap, or your project's "
            f"requirements) into the executors' Python, or {executor_python_fix(bridge)}; for dependencies "
            f"packaged as zips use spark.submit.pyFiles (--py-files)")
    _check_same_version(results)
    advise_worker_daemon(bridge)
    with _verified_lock:
        _verified_contexts.add(key)


def advise_worker_daemon(bridge) -> bool:
    """On a cluster whose executors fork Python workers from Spark's own daemon, a subtask
    restarted after a lost host or slot waits for a cold worker to import numpy, pyarrow and
    streamsnap (about 4 s on a busy host): say how to preload them. True when it advised."""
    from streamsnap.cluster.spark_session import WORKER_DAEMON

    master = bridge.master or ""
    if master.startswith("local") or bridge.conf("spark.python.use.daemon", "true") == "false":
        return False
    daemon = bridge.conf("spark.python.daemon.module", "pyspark.daemon")
    if daemon == WORKER_DAEMON:
        return False
    log.warning("the executors start Python workers from %s, which imports nothing ahead: a subtask "
                "restarted after a lost host or slot waits seconds for a cold worker's imports. Fix: "
                "build the session with .config('spark.python.daemon.module', '%s') where every executor "
                "can import streamsnap (docs/how-to/cluster.md)", daemon, WORKER_DAEMON)
    return True


def _check_same_version(results: list[tuple]) -> None:
    """The executors must run this driver's streamsnap: the wire messages, the state formats and
    the job's pickled functions assume one version on both sides (as Flink's client and cluster)."""
    import streamsnap

    for status, detail, executable, _ in results:
        version, _, where = str(detail).partition(" ")
        if status == "ok" and version and version != streamsnap.__version__:
            raise PreflightError(
                f"the Spark executors run streamsnap {version} ({where}, Python at {executable}), this driver "
                f"runs {streamsnap.__version__}: both must run the same version. Fix: pip install "
                f"'streamsnap=={streamsnap.__version__}' into the executors' Python (or upgrade the driver's), "
                f"and restart the executors' Python workers (a worker daemon that preloaded streamsnap, "
                f"spark.python.daemon.module, keeps the version it started with)")


# ===================================================================== all of it
def run(graph, checkpointing, restored_uids=frozenset()) -> None:
    """The checks of one `execute()` that need no Spark (`check_executors` is the other one);
    `graph` is the job's StreamGraph, restored_uids the operators the restore point has state
    of (a sink among them resumes its own output)."""
    if checkpointing is not None:
        check_directory(checkpointing.directory, "the checkpoint directory", "CheckpointConfig(directory=...)")
    for node in graph.nodes.values():
        check_picklable(_operator_label(node), node.operator)
    for node in graph.nodes.values():
        sink = getattr(node.operator, "sink", None)
        check_output = getattr(sink, "check_output", None)
        if callable(check_output):
            check_output(node.name, node.uid in restored_uids)
    for node in graph.nodes.values():
        for endpoint in (getattr(node.operator, "source", None), getattr(node.operator, "sink", None)):
            check_endpoint = getattr(endpoint, "preflight", None)
            if callable(check_endpoint):
                check_endpoint(_operator_label(node))


__all__ = ["run", "check_directory", "check_picklable", "check_executors", "probe_executors", "package_zip"]
