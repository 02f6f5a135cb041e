"""The backend registry, the sections backends bring, LaunchOptions, and the architecture checks
that keep backend knowledge in the backend folders (scripts/backend_names.py,
scripts/class_sizes.py). Quick tests; tests/test_backend_plugin.py installs a real package."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import tomllib
from click.testing import CliRunner

from tests.helpers import ROOT
from tflaunch.cli import cli
from tflaunch.cluster import backends, registry
from tflaunch.cluster.backends import BackendFeature, BackendSpec
from tflaunch.cluster.config import config_schema, parse_config
from tflaunch.cluster.schema import field
from tflaunch.errors import ConfigError, LaunchError
from tflaunch.launchers import get_backend
from tflaunch.launchers.base import LaunchOptions
from tflaunch.launchers.slurm.section import SlurmSection
from tflaunch.launchers.ssh.section import SshSection
from tflaunch.trace.request import TraceRequest, TraceWindow


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclasses.dataclass(frozen=True)
class KubeSection:
    """Kube settings (backend: kube)."""

    namespace: str = field("default", doc="namespace")


def _kube_check(config, fail) -> None:
    if config.section(KubeSection).namespace == "kube-system":
        fail(("kube", "namespace"), "is the system's own; pick another")


KUBE = BackendSpec(
    name="kube",
    backend="tflaunch.launchers.local.backend:LocalBackend",
    section=KubeSection,
    check=_kube_check,
)


@pytest.fixture
def installed(monkeypatch):
    """Stand-in entry points of installed packages (the group's only boundary we do not own)."""

    def use(*entries: tuple[str, str]):
        points = [EntryPoint(n, v, backends.GROUP) for n, v in entries]
        monkeypatch.setattr(registry, "entry_points", lambda group: points)
        backends.BACKENDS.clear()

    yield use
    backends.BACKENDS.clear()


def test_the_built_ins_are_registered_in_folder_order_and_in_pyproject():
    assert backends.names()[:3] == ["local", "slurm", "ssh"]
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    for name, value in declared["tflaunch.backends"].items():
        module, _, attr = value.partition(":")
        assert getattr(importlib.import_module(module), attr) is backends.spec_of(name)
    assert set(declared["tflaunch.backends"]) == {"local", "slurm", "ssh"}
    assert type(get_backend("slurm")).__name__ == "SlurmBackend"


def test_an_unknown_backend_is_bad_input_listing_the_registered_ones(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("program: [p]\nbackend: slrum\n")
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 2
    assert (
        f"{path}:2: backend: expected one of 'local', 'slurm', 'ssh', got 'slrum' "
        "(did you mean 'slurm'?)." in result.output
    )
    with pytest.raises(ConfigError, match="unknown backend 'kube'; choose one of local, slurm"):
        get_backend("kube")


def test_an_installed_backend_brings_its_section_check_and_schema(installed):
    installed(("kube", f"{__name__}:KUBE"))
    config = parse_config("program: [p]\nbackend: kube\nkube: {namespace: tf}\n")
    assert (
        config.section(KubeSection) == KubeSection("tf")
        and config.section(SlurmSection).python == "python3"
    )
    assert parse_config("program: [p]\n").section(KubeSection) == KubeSection()  # every section
    with pytest.raises(ConfigError, match="<string>:4: kube.namespace: is the system's own"):
        parse_config("program: [p]\nbackend: kube\nkube:\n  namespace: kube-system\n")
    with pytest.raises(ConfigError, match="unknown key 'namespce': did you mean 'namespace'"):
        parse_config("program: [p]\nkube: {namespce: x}\n")
    schema = config_schema()
    assert schema["properties"]["backend"]["enum"] == ["local", "slurm", "ssh", "kube"]
    assert list(schema["properties"])[-3:] == ["slurm", "ssh", "kube"]
    assert schema["properties"]["kube"]["properties"]["namespace"]["default"] == "default"
    result = CliRunner().invoke(cli, ["schema"])
    assert json.loads(result.output) == schema


def test_installed_backends_that_cannot_be_used_are_errors_naming_them(installed):
    installed(("kube", "no_such_package_anywhere:BACKEND"))
    with pytest.raises(ConfigError, match=r"'kube = no_such_package_anywhere:BACKEND'.*uninstall"):
        backends.names()
    installed(("ssh", f"{__name__}:KUBE"))
    with pytest.raises(ConfigError, match="two installed packages register a backend called 'ssh'"):
        backends.names()
    installed(("cube", f"{__name__}:KUBE"))
    with pytest.raises(ConfigError, match="does not name a tflaunch BackendSpec called 'cube'"):
        backends.names()
    installed(("ssh", "tflaunch.launchers.ssh:BACKEND"))  # an installed tflaunch's own: fine
    assert backends.names() == ["local", "slurm", "ssh"]


def test_a_config_section_is_replaced_through_with_section():
    config = parse_config("program: [p]\nbackend: ssh\nhosts: [a]\n")
    changed = config.with_section(
        "ssh", dataclasses.replace(config.section(SshSection), python="python3.11")
    )
    assert (
        changed.section(SshSection).python == "python3.11"
        and config.section(SshSection).python == "python3"
    )
    assert changed.workdir == "." and changed != config
    with pytest.raises(LookupError, match="no section of type KubeSection"):
        config.section(KubeSection)  # kube is not registered here
    with pytest.raises(AttributeError):  # sections are read by their type, not as attributes
        _ = config.ssh


def test_launch_options_reach_a_detached_daemon_as_arguments():
    assert LaunchOptions().argv() == []
    assert LaunchOptions("tmux", True).argv() == ["--terminals", "tmux", "--down"]
    traced = LaunchOptions(trace=TraceRequest(Path("t"), window=TraceWindow(2, 5)))
    assert traced.argv() == ["--trace", "2:5", "--trace-port-offset", "10000"]


def test_backend_names_are_compared_only_in_their_own_folder(tmp_path):
    checker = _script("backend_names")
    names = {"local", "slurm", "ssh"}
    source = (
        "if config.backend == 'ssh':\n    pass\n"
        "ok = backend in ('slurm', 'other')\n"
        "match kind:\n    case 'local':\n        pass\n"
        "x = {'local': 1}\n"  # a mapping key is not a comparison
    )
    (tmp_path / "m.py").write_text(source)
    found = checker.violations(tmp_path / "m.py", names)
    assert [line.split(": ", 1)[1] for line in found] == [
        "compares the backend name 'ssh'",
        "compares the backend name 'slurm'",
        "compares the backend name 'local'",
    ]
    own = ROOT / "launchers" / "ssh" / "backend.py"
    assert checker.own_backend(own, names) == "ssh"
    assert checker.main([]) == 0  # the tree as it is


def test_the_trace_hook_imports_the_standard_library_only(tmp_path):
    """tflaunch/tracehook runs inside users' programs: nothing of tflaunch, nothing installed."""
    checker = _script("hook_imports")
    source = (
        "import os, json\nfrom importlib.util import find_spec\n"
        "import tflaunch.errors\nfrom . import other\nimport numpy\n"
        "import importlib\nimportlib.import_module('tflaunch.trace')\n"
    )
    (tmp_path / "sitecustomize.py").write_text(source)
    found = checker.violations(tmp_path)
    assert [line.split(": ", 1)[1] for line in found] == [
        "imports tflaunch.errors (only the standard library)",
        "imports tflaunch.tracehook (only the standard library)",
        "imports numpy (only the standard library)",
        "imports tflaunch.trace (only the standard library)",
    ]
    assert checker.main([]) == 0  # the hook as it is


def test_no_class_grows_past_250_lines_unnoticed(tmp_path, monkeypatch):
    checker = _script("class_sizes")
    assert checker.MAX_LINES == 250  # issue 41
    body = "\n".join(f"    x{i} = {i}" for i in range(250))
    (tmp_path / "big.py").write_text(f"class Big:\n{body}\n\n\nclass Small:\n    pass\n")
    sizes = checker.class_sizes(tmp_path / "big.py")
    assert sorted(sizes.values()) == [2, 251]
    assert checker.problems(sizes, complete=False) == [
        f"{tmp_path / 'big.py'}:Big: 251 lines; a class has at most 250: split it"
    ]
    assert checker.KNOWN == {}  # the Coordinator's entry left with the split
    known = "tflaunch/old.py:Old"
    monkeypatch.setattr(checker, "KNOWN", {known: (569, "an old big class")})
    assert checker.problems({known: 250}, complete=True) == [
        f"{known}: now within 250 lines (or gone); remove it from KNOWN"
    ]
    assert "more than its known" in checker.problems({known: 10_000}, complete=False)[0]
    monkeypatch.setattr(checker, "KNOWN", {})
    assert checker.main([]) == 0


def test_no_module_grows_past_600_lines_unnoticed(tmp_path):
    checker = _script("class_sizes")
    fits, big = tmp_path / "fits.py", tmp_path / "big.py"
    fits.write_text("x = 1\n" * 600)
    big.write_text("x = 1\n" * 601)
    assert checker.module_problems([fits]) == []
    assert checker.module_problems([fits, big]) == [
        f"{big}: 601 lines; a module has at most 600: split it along its jobs"
    ]
    assert checker.main([str(big)]) == 1


def test_options_ask_for_declared_abilities_and_are_refused_naming_who_has_them():
    asked = LaunchOptions(terminals="tmux", keep=True).features()
    assert asked == [(BackendFeature.TERMINALS, "--terminals"), (BackendFeature.KEEP, "--keep")]
    assert LaunchOptions(down_at_end=True).features() == []
    assert BackendFeature.TERMINALS in backends.spec_of("local").features
    backends.spec_of("ssh").require(BackendFeature.KEEP, "--keep")  # declared: nothing raised
    with pytest.raises(LaunchError, match=r"^--terminals works with the local backend only; "
                       r"this cluster file uses 'kube'\. Follow the tasks with"):  # fmt: skip
        KUBE.require(BackendFeature.TERMINALS, "--terminals")
    with pytest.raises(LaunchError, match="--keep keeps the machines .* backend 'kube' makes none "
                       r"\(the ssh backend does"):  # fmt: skip
        KUBE.require(BackendFeature.KEEP, "--keep")
