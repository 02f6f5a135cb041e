"""tflaunch.plugin is the surface backends and providers build on: every name it lists resolves,
its type-checking imports say the same, and in-tree backends import tflaunch only through it
(the SSH backend's few imports around it are listed below, module by module, with why)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import tflaunch.plugin as plugin
from tests.helpers import ROOT, imported_modules
from tflaunch.cluster.backends import BACKENDS, BackendSpec

PLUGIN_FILE = ROOT / "tflaunch" / "plugin.py"

# What an in-tree backend still imports around tflaunch.plugin: its folder -> the tflaunch modules.
# Only the SSH backend, for what no other backend needs and the surface does not promise: it asks
# the clouds' provisioning for hosts (it is the one backend clouds serve), runs the coordinator on a
# host of a detached run (the runtime's coordinate, rendezvous and protocol, the agent's entry and
# the trace handed to that coordinator), gathers an SSH trace
# (the trace site's helper and files) and forwards TensorBoard. Add nothing here: extend
# tflaunch.plugin instead.
AROUND_THE_SURFACE = {
    "ssh": {
        "tflaunch.launchers.clouds",
        "tflaunch.launchers.clouds.admin",
        "tflaunch.launchers.clouds.base",
        "tflaunch.launchers.clouds.fleet",
        "tflaunch.launchers.clouds.listing",
        "tflaunch.launchers.clouds.provisioning",
        "tflaunch.launchers.clouds.records",
        "tflaunch.launchers.clouds.state",
        "tflaunch.launchers.agent",
        "tflaunch.launchers.tensorboard_serve",
        "tflaunch.runtime",
        "tflaunch.runtime.coordinator",
        "tflaunch.runtime.link",
        "tflaunch.runtime.rendezvous",
        "tflaunch.runtime.runctl",
        "tflaunch.text",
        "tflaunch.trace.files",
        "tflaunch.trace.format",
        "tflaunch.trace.run",
        "tflaunch.trace.site",
    },
}


def tflaunch_imports(folder: Path) -> dict[str, set[str]]:
    """Every tflaunch module the ``.py`` files under ``folder`` import -> the files that do."""
    found: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        for module in imported_modules(path):
            if module == "tflaunch" or module.startswith("tflaunch."):
                found.setdefault(module, set()).add(str(path.relative_to(ROOT)))
    return found


def around_the_surface(folder: Path, own: str) -> dict[str, set[str]]:
    """The imports under ``folder`` that are neither tflaunch.plugin nor the folder's own."""
    return {
        module: files
        for module, files in tflaunch_imports(folder).items()
        if module != "tflaunch.plugin" and not module.startswith(own)
    }


def type_checking_names() -> set[str]:
    """The names plugin.py imports under ``if TYPE_CHECKING:`` (what type checkers see)."""
    tree = ast.parse(PLUGIN_FILE.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for item in ast.walk(node):
                if isinstance(item, ast.ImportFrom):
                    names |= {alias.asname or alias.name for alias in item.names}
    return names


def test_every_listed_name_resolves():
    missing = []
    for name in plugin.__all__:
        try:
            getattr(plugin, name)
        except (AttributeError, ImportError) as err:
            missing.append(f"{name}: {err}")
    assert missing == [], "tflaunch.plugin lists names that no longer exist:\n" + "\n".join(missing)


def test_type_checkers_see_the_same_names():
    assert type_checking_names() == set(plugin.__all__)


def test_a_name_it_does_not_list_is_an_error_that_says_so():
    with pytest.raises(AttributeError, match="plugins use only the names it lists"):
        plugin.coordinate  # noqa: B018 - the runtime's coordinate is not on the surface
    assert "BatchBackend" in dir(plugin) and "coordinate" not in dir(plugin)


def test_importing_it_is_cheap_and_a_name_brings_only_its_module():
    """Each backend's folder is imported on every command: the surface costs nothing until a
    name is used, and the registration names do not pull in the runtime."""
    code = (
        "import sys, tflaunch.plugin as p\n"
        "before = {m for m in sys.modules if m.startswith('tflaunch.')}\n"
        "p.BackendSpec, p.field, p.Fail\n"
        "print(sorted(before)); print('tflaunch.runtime.coordinator' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.splitlines()
    assert out == ["['tflaunch.plugin']", "False"]


def test_the_surface_holds_what_a_batch_backend_needs():
    assert issubclass(plugin.BatchBackend, plugin.Backend)
    assert isinstance(BACKENDS.specs()["slurm"], BackendSpec)
    assert plugin.JobState("F", ending="failed").ended
    with pytest.raises(ValueError, match="ending 'lost' is not one of"):
        plugin.JobState("X", ending="lost")


@pytest.mark.parametrize(
    "name", sorted(n for n in BACKENDS.specs() if (ROOT / "launchers" / n).is_dir())
)
def test_in_tree_backends_import_tflaunch_only_through_the_plugin(name):
    folder = ROOT / "launchers" / name
    found = around_the_surface(folder, f"tflaunch.launchers.{name}")
    allowed = AROUND_THE_SURFACE.get(name, set())
    new = {m: sorted(f) for m, f in found.items() if m not in allowed}
    assert new == {}, (
        f"launchers/{name}/ imports tflaunch around tflaunch.plugin; import these names from "
        f"tflaunch.plugin (adding them there, documented in docs/plugins.md): {new}"
    )
    stale = sorted(allowed - set(found))
    assert stale == [], f"AROUND_THE_SURFACE lists imports launchers/{name}/ no longer has: {stale}"


@pytest.mark.parametrize(
    "name", sorted(p.parent.name for p in (ROOT / "launchers" / "clouds").glob("*/__init__.py"))
)
def test_in_tree_clouds_import_tflaunch_only_through_the_plugin(name):
    found = around_the_surface(
        ROOT / "launchers" / "clouds" / name, f"tflaunch.launchers.clouds.{name}"
    )
    assert {m: sorted(f) for m, f in found.items()} == {}, (
        f"launchers/clouds/{name}/ imports tflaunch around tflaunch.plugin; import these names "
        "from tflaunch.plugin (adding them there, documented in docs/plugins.md)"
    )


def test_the_plugin_packages_in_the_test_data_import_only_the_plugin():
    for package in ("backend_plugin", "pbs_backend"):
        folder = ROOT / "tests" / "data" / package
        assert set(tflaunch_imports(folder)) == {"tflaunch.plugin"}, package
