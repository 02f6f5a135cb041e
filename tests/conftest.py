"""Shared test helpers.

Tests that need root, network namespaces or system packages skip with a reason on a developer
laptop, and fail instead when ``CI`` is set: a green CI must mean they ran.
"""

from __future__ import annotations

import ast
import gc
import inspect
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest


def skip_or_fail(reason: str) -> None:
    """Skip the test on a developer machine; fail it under CI, where every test must run."""
    if os.environ.get("CI"):
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture
def second_pid_namespace() -> None:
    """What :func:`tests.helpers.in_second_pid_namespace` needs: root and a working unshare."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        skip_or_fail("a second PID namespace needs root and unshare (util-linux)")
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        skip_or_fail(f"unshare --pid --fork --mount-proc fails here: {probe.stderr.strip()}")


@pytest.fixture(scope="module")
def ec2_endpoint():
    """moto's server on a free local port, standing in for the EC2 API."""
    moto_server = pytest.importorskip("moto.server")
    pytest.importorskip("boto3")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture()
def aws_credentials(monkeypatch, tmp_path):
    """Credentials for the stand-in only; no real profile or account is ever read."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask a metadata service
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.delenv("AWS_PROFILE", raising=False)


# -- pytest-xdist: the Slurm test cluster is one per machine ---------------------------------------
# scripts/test.sh runs the suite on several workers (--dist loadgroup). The SSH test hosts come in
# sets, one per worker (tests/hosts/ssh_hosts.py), so their tests spread over the workers like any
# other. The Slurm test cluster is one per machine (fixed node names in /etc/hosts, slurmctld's
# fixed ports) behind a lock: a worker that waited on another's lock would idle. So every test of
# a module that imports it joins its group, which a single worker runs in turn, while the other
# tests spread over the rest.
_HOST_GROUPS = {"tests.hosts.slurm_cluster": "slurm-cluster"}


def _host_group(module: object) -> str | None:
    for value in vars(module).values():
        name = getattr(value, "__module__", None) or getattr(value, "__name__", None)
        if name in _HOST_GROUPS:
            return _HOST_GROUPS[name]
    return None


# -- TensorFlow in the test process: TensorFlow's behaviour, so slow ------------------------------
# Importing TensorFlow costs a process seconds of CPU and ~500 MiB before a graph is built, and the
# quick subset (-m "not slow") is the edit-test loop of the launcher, which never imports it. So a
# test that imports TensorFlow (or Keras) in the pytest process is marked `tensorflow`, and with it
# `slow`: where its module does at top level, where its body does, or where a fixture it requests
# does (`import tensorflow`, `pytest.importorskip("tensorflow")`). A module that imports it at top
# level is not even imported when the -m expression deselects its tests: importing it to collect
# them would cost every pytest-xdist worker the import.
_TENSORFLOW = frozenset({"tensorflow", "keras", "tf_keras"})
_TESTS = Path(__file__).resolve().parent


def _imports_tensorflow(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Import):
            names = [alias.name for alias in sub.names]
        elif isinstance(sub, ast.ImportFrom):
            names = [sub.module or ""]
        elif (
            isinstance(sub, ast.Call)
            and getattr(sub.func, "attr", getattr(sub.func, "id", None)) == "importorskip"
            and sub.args
            and isinstance(sub.args[0], ast.Constant)
        ):
            names = [str(sub.args[0].value)]
        else:
            continue
        if any(name.split(".")[0] in _TENSORFLOW for name in names):
            return True
    return False


@cache
def _syntax(path: Path) -> ast.Module:
    try:
        return ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError, ValueError):
        return ast.Module(body=[], type_ignores=[])  # pytest's own collection reports it


@cache
def _functions(path: Path) -> dict[int, ast.AST]:
    """A file's functions by their first line (their first decorator's, as in ``co_firstlineno``)."""
    return {
        min([node.lineno, *(d.lineno for d in node.decorator_list)]): node
        for node in ast.walk(_syntax(path))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


@cache
def _top_level_imports_tensorflow(path: Path) -> bool:
    """Whether the module's top level (outside functions and classes) imports TensorFlow."""
    tree = _syntax(path)
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return any(_imports_tensorflow(stmt) for stmt in tree.body if not isinstance(stmt, defs))


_FUNCTIONS: dict[object, bool] = {}  # a function of tests/: whether it imports TensorFlow


def _function_imports_tensorflow(function) -> bool:
    """Whether a function of tests/, or one of tests/ it calls by name, imports TensorFlow."""
    function = inspect.unwrap(function)
    code = getattr(function, "__code__", None)
    if code is None or not Path(code.co_filename).is_relative_to(_TESTS):
        return False  # pytest's own fixtures, a library's functions
    if function not in _FUNCTIONS:
        _FUNCTIONS[function] = False  # a recursive call reads False until the answer is known
        tree = _functions(Path(code.co_filename)).get(code.co_firstlineno)
        if tree is None:
            return False
        names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        called = (function.__globals__.get(name) for name in names)
        _FUNCTIONS[function] = _imports_tensorflow(tree) or any(
            _function_imports_tensorflow(helper) for helper in called if inspect.isfunction(helper)
        )
    return _FUNCTIONS[function]


def _uses_tensorflow(item: pytest.Item) -> bool:
    path = getattr(item, "path", None)
    if path is not None and path.suffix == ".py" and _top_level_imports_tensorflow(path):
        return True
    function = getattr(item, "function", None)
    if function is not None and _function_imports_tensorflow(function):
        return True
    fixtures = getattr(item, "_fixtureinfo", None)
    definitions = fixtures.name2fixturedefs.values() if fixtures is not None else ()
    return any(_function_imports_tensorflow(d.func) for defs in definitions for d in defs)


def _selected_if_tensorflow(config: pytest.Config) -> bool:
    """Whether the -m expression keeps a test marked `tensorflow` and `slow` (and no other)."""
    markexpr = config.getoption("markexpr", "")
    if not markexpr:
        return True
    from _pytest.mark.expression import Expression  # what pytest's -m itself evaluates

    implied = {"tensorflow", "slow"}
    return Expression.compile(markexpr).evaluate(lambda name, /, **kwargs: name in implied)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if (
        collection_path.suffix == ".py"
        and collection_path.name.startswith("test_")
        and _top_level_imports_tensorflow(collection_path)
        and not _selected_if_tensorflow(config)
    ):
        return True
    return None


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Where the -m expression leaves out the `tensorflow` tests (the quick subset), a test that
    imports TensorFlow anyway is one the rule above missed: say which, so it gets the marker."""
    config = item.config
    if "tensorflow" in sys.modules and not config.stash.get(_TENSORFLOW_SEEN, False):
        config.stash[_TENSORFLOW_SEEN] = True
        if not _selected_if_tensorflow(config):
            pytest.fail(
                f"{item.nodeid} imported TensorFlow in the test process, in a run that leaves "
                "out the tensorflow tests: mark it @pytest.mark.tensorflow (and slow), or keep "
                "TensorFlow out of it (tests/README.md)",
                pytrace=False,
            )


_TENSORFLOW_SEEN = pytest.StashKey[bool]()


# -- garbage collection once TensorFlow is in the process -----------------------------------------
# TensorFlow's import leaves some 370,000 objects that every full collection of the garbage
# collector walks again (0.2 s of CPU each: 11 of them, 2.6 s, in a run of test_placement and
# test_models), and pytest forces five more at the session's end (where it looks for unraisable
# exceptions). Once a test has imported TensorFlow, and again at the end, one collection clears
# the garbage and gc.freeze() moves what survives (TensorFlow's modules, mostly) out of the
# collector's way: later collections walk only what was made since.
@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish() -> None:
    if "tensorflow" in sys.modules and not gc.get_freeze_count():
        gc.collect()
        gc.freeze()


def pytest_unconfigure() -> None:
    gc.collect()  # with pytest's unraisable-exception hook still in place, so it reports them
    gc.freeze()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups, and -m's
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("tensorflow") or _uses_tensorflow(item):
            item.add_marker(pytest.mark.tensorflow)
            item.add_marker(pytest.mark.slow)
        elif "ec2_endpoint" in getattr(item, "fixturenames", ()):
            # moto's EC2 and boto3's clients cost about a second of CPU a test: the lab cloud's
            # tests keep the cloud-neutral provisioning in the quick subset.
            item.add_marker(pytest.mark.slow)
    groups: dict[object, str | None] = {}
    for item in items:  # a module's group: from its own imports
        module = getattr(item, "module", None)
        if module is not None and module not in groups:
            groups[module] = _host_group(module)
    for item in items:
        group = groups.get(getattr(item, "module", None))
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist (3.8) marks a test's group by rewriting its node id, which pytest 9 no longer
    lets it do: the grouped tests would spread over the workers, and one worker would wait on
    another's Slurm-cluster lock until it timed out. Refuse that pair before anything runs."""
    if config.getoption("dist", "no") == "loadgroup" and pytest.version_tuple >= (9,):
        raise pytest.UsageError(
            f"--dist loadgroup does not group tests under pytest {pytest.__version__} (pytest-xdist "
            "cannot mark groups there): install the versions in constraints.txt (scripts/test.sh "
            "does), or run with TEST_WORKERS=0."
        )


@pytest.fixture
def tiny_cnn(monkeypatch) -> str:
    """``--model tiny_cnn`` for the benchmark in this process (tests/tiny_cnn.py): the model
    table with the tiny CNN added for the test."""
    pytest.importorskip("tensorflow")
    from tests.tiny_cnn import SPEC
    from tflaunch.models import registry

    monkeypatch.setitem(registry.MODELS, SPEC.name, SPEC)
    return SPEC.name
