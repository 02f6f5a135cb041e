"""The cluster file: YAML parsed once into frozen dataclasses.

A cluster file says what runs (``program``), how many of each task (``roles``), where
(``hosts``, ``placement``, ``ports``), how it is supervised (``supervision``), which backend starts
it (``backend``) and where run state goes (``runs_dir``). Each backend adds its own section
(``slurm:``, ``ssh:``) with its own checks, through the registry in
:mod:`tflaunch.cluster.backends`; every registered backend's section may appear in every file.
``kubernetes:`` is no backend's: it only feeds ``tflaunch export --format tfjob``.
Every error names the file, the line and the key path, says what was expected and, for a typo,
the nearest valid key. ``tflaunch schema`` prints the JSON Schema derived from these classes.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from tflaunch.cluster import backends, schema, yamlfile
from tflaunch.cluster.bounds import (
    MAX_HOSTS,
    MAX_ITEMS,
    MAX_PORT,
    MAX_TASKS,
    gpu_count,
    one_line,
    task_count,
)
from tflaunch.cluster.schema import field
from tflaunch.cluster.supervision import Supervision
from tflaunch.errors import ConfigError

S = TypeVar("S")  # a backend's section class (ClusterConfig.section)

LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"  # tf.keras is tf_keras (Keras 2) when it is 1
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A cluster name prefixes run ids, which commands take as arguments: one starting with '-' would
# read as an option, one starting with '.' names a hidden folder.
NAME_START = re.compile(r"[A-Za-z0-9]")
# A Kubernetes namespace is an RFC 1123 label: lower-case letters, digits and '-', starting and
# ending with a letter or digit, at most 63 characters.
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def namespace_problem(namespace: str) -> str | None:
    """Why ``namespace`` cannot be a Kubernetes namespace, or None."""
    why = "is not a Kubernetes namespace: use lower-case letters, digits and '-', starting and"
    why += " ending with a letter or digit, at most 63 characters (e.g. ml-team)"
    return None if DNS_LABEL.fullmatch(namespace) else f"{namespace!r} {why}"


def env_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be an environment variable name (POSIX: letters, digits, _), or None."""
    why = "is not a valid environment variable name; use letters, digits and _, not starting with"
    return None if ENV_NAME.fullmatch(name) else f"{name!r} {why} a digit"


def _mode_problem(value: str) -> str | None:
    if not re.fullmatch(r"0?[0-7]{3}", value):
        return f"{value!r} is not an octal mode such as '0700' or '0750'"
    if int(value, 8) & 0o700 != 0o700:
        return f"{value!r} must give the owner read, write and search permission (0700)"
    return None


def _host_entry(raw: Any) -> Any:
    """A host may be written as a bare name: ``- node1``."""
    return {"name": raw} if isinstance(raw, str) else raw


def _program_entry(raw: Any) -> Any:
    """``program:`` may be written as the argv list alone."""
    return {"argv": raw} if isinstance(raw, list) else raw


@dataclass(frozen=True)
class Program:
    """What every task runs. Placeholders in argv: {job_name} {task_index} {ps_hosts}
    {worker_hosts} {chief_hosts} {num_ps} {num_workers} {host} {port} {checkpoint_dir}
    {cluster_file}; write {{ for a brace."""

    argv: tuple[str, ...] = field(
        doc="the command as a list of arguments, e.g. [python, train.py]", maximum=MAX_ITEMS
    )
    workdir: str = field(".", doc="directory the tasks run in (relative to the cluster file)")
    env: Mapping[str, str] = field(
        factory=dict,
        doc="extra environment variables for every task; the values are written to the run "
        "directory's plan.json (and the Slurm job's copy of this file): use env_from for secrets",
    )
    env_from: tuple[str, ...] = field(
        (),
        doc="names of variables the tasks take from the launcher's environment at 'up', never "
        "written to plan files (e.g. [WANDB_API_KEY]); backends local and slurm",
        maximum=MAX_ITEMS,
    )
    checkpoint_dir: str | None = field(
        None,
        doc="checkpoint directory: {checkpoint_dir} in argv and $TFLAUNCH_CHECKPOINT_DIR "
        "(relative to the workdir; default: checkpoints/ in the run directory, on the hosts "
        "over ssh)",
    )
    tf_config: bool = field(
        True,
        doc="export TF_CONFIG to every task; false for clusters too big for one environment "
        "string (128 KiB), whose tasks read the file named by $TFLAUNCH_CLUSTER_FILE",
    )
    keras: Literal["default", "legacy"] = field(
        "default",
        doc="legacy: tf.keras is Keras 2 (the tf_keras package: pip install 'tflaunch[keras2]') "
        "by setting TF_USE_LEGACY_KERAS=1 for every task, as tf.keras programs using "
        "MultiWorkerMirroredStrategy or ParameterServerStrategy need under TensorFlow 2.16+, "
        "whose Keras 3 fails in fit(); default: whatever Keras the TensorFlow install has",
    )


@dataclass(frozen=True)
class Roles:
    """How many tasks of each kind."""

    ps: int = task_count(1, doc="parameter servers")
    worker: int = task_count(2, doc="workers")
    chief: int = task_count(0, doc="chief (0 or 1); without one, worker 0 is the chief")
    evaluator: int = task_count(0, doc="evaluator (0 or 1); runs beside the training cluster")


@dataclass(frozen=True)
class HostEntry:
    """One machine. Written as a bare name or as a mapping."""

    name: str = one_line(doc="host name; also the cluster address unless 'address' is given")
    address: str | None = one_line(None, doc="address the tasks use to reach each other")
    connect: str | None = one_line(
        None, doc="address the launcher connects to (ssh); default: address"
    )
    gpus: int | None = gpu_count(
        None,
        doc="number of GPUs on the host; absent: found by the backend (local: nvidia-smi -L, "
        "within an inherited CUDA_VISIBLE_DEVICES; ssh: pre-flight's nvidia-smi); 0: none",
    )


@dataclass(frozen=True)
class Placement:
    """Where tasks go on the hosts."""

    ps: Literal["colocated", "dedicated"] = field(
        "colocated",
        doc="colocated: PS i on worker host i; dedicated: one host per PS after the worker hosts",
    )
    ps_per_host: int | None = task_count(
        None,
        minimum=1,
        doc="at most this many co-located PS per host; default: spread evenly over the worker hosts",
    )
    workers_per_host: int | None = task_count(
        None,
        minimum=1,
        doc="worker slots per host (chief and evaluator take slots too); default: as few hosts as the GPUs allow, else spread evenly",
    )
    gpus_per_worker: int | None = gpu_count(
        None, doc="GPUs per worker; default 1, or all of the host's GPUs with one worker per host"
    )
    cpus_per_task: int | None = field(
        None,
        minimum=1,
        doc="pin every task to this many cores of its host, disjoint per task, as Slurm's "
        "--cpus-per-task binding; default: unpinned (tasks share all cores)",
    )


@dataclass(frozen=True)
class Ports:
    """Base port of each job on each host; tasks on one host count up from it, skipping taken ports.
    Where the file names no base for a job, the local backend picks free ports at each ``up``
    instead (two runs of one file at once do not collide); other backends count up from these
    defaults."""

    ps: int = field(2230, minimum=1, maximum=MAX_PORT, doc="first PS port on a host")
    worker: int = field(2220, minimum=1, maximum=MAX_PORT, doc="first worker port on a host")
    chief: int = field(
        2210,
        minimum=1,
        maximum=MAX_PORT,
        doc="chief port (the evaluator needs none: it is not in the cluster)",
    )


@dataclass(frozen=True)
class KubernetesSection:
    """For 'tflaunch export --format tfjob', which writes the cluster as a Kubeflow TFJob. Not a
    backend: tflaunch starts nothing on Kubernetes."""

    image: str | None = one_line(None, doc="container image with the program and TensorFlow")
    namespace: str = one_line("default", doc="namespace of the TFJob")
    workdir: str | None = one_line(
        None, doc="working directory in the container (default: the image's)"
    )
    checkpoint_dir: str | None = one_line(
        None,
        doc="{checkpoint_dir} in the container: a path on a volume every pod mounts "
        "(default: program.checkpoint_dir when it is absolute)",
    )
    gpu_resource: str = one_line(
        "nvidia.com/gpu", doc="the extended resource GPUs are requested as"
    )


@dataclass(frozen=True)
class ClusterConfig:
    """A distributed TensorFlow cluster: what runs, how many tasks, where, and how."""

    program: Program = field(doc="what every task runs", coerce=_program_entry)
    name: str = one_line("tflaunch", doc="cluster name; prefixes run ids")
    backend: str = field(
        "local",
        doc="how tasks are started",
        choices=lambda: backends.BACKENDS.choices(),
        unknown_choice="backends are those of the packages installed here (tflaunch's own and "
        "plugins registering the entry point group tflaunch.backends, docs/plugins.md): install "
        "the package that provides it into this Python",
    )
    roles: Roles = field(factory=Roles, doc="task counts")
    hosts: tuple[HostEntry, ...] = field(
        (),
        doc="machines (local default: localhost)",
        maximum=MAX_HOSTS,
        coerce=lambda v: [_host_entry(h) for h in v] if isinstance(v, list) else v,
    )
    placement: Placement = field(factory=Placement, doc="task placement")
    ports: Ports = field(factory=Ports, doc="base ports")
    supervision: Supervision = field(factory=Supervision, doc="supervision")
    runs_dir: str = one_line(
        "runs", doc="where run directories go (relative to the working directory)"
    )
    run_dir_mode: str = field(
        "0700",
        doc="permissions of each run directory, as an octal string; its files get the same "
        "without the search bits (0700: only you can read plans and logs; '0750' shares them "
        "with your group)",
        check=lambda v: _mode_problem(v),
    )
    kubernetes: KubernetesSection = field(
        factory=KubernetesSection, doc="image and namespace for 'tflaunch export --format tfjob'"
    )
    # Every backend's own section (``slurm:``, ``ssh:``), keyed by the backend's name: read
    # through the backend registry, read by type as ``config.section(SlurmSection)``. Set by the
    # loader.
    sections: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType(backends.default_sections()),
        metadata={"internal": True, "sections": True},
    )
    # Set by the loader, never read from the file.
    source: str = dataclasses.field(default="<string>", compare=False, metadata={"internal": True})
    base_dir: str = dataclasses.field(default=".", compare=False, metadata={"internal": True})
    # The file names no roles.ps: its PS come from the default (tflaunch plan marks them).
    ps_by_default: bool = dataclasses.field(
        default=False, compare=False, metadata={"internal": True}
    )
    # The jobs whose base port the file names (ports:): the local backend picks the others' ports.
    ports_pinned: frozenset[str] = dataclasses.field(
        default=frozenset(), compare=False, metadata={"internal": True}
    )
    # The line of every key path of the file, for errors found after loading (the plan's).
    positions: Mapping[tuple, int] = dataclasses.field(
        default_factory=dict, compare=False, repr=False, metadata={"internal": True}
    )

    def where(self, *path: str | int) -> str:
        """``file:line`` of the key at ``path`` (or the nearest key above it that has one)."""
        key = tuple(path)
        while key and key not in self.positions:
            key = key[:-1]
        return f"{self.source}:{self.positions[key]}" if key else self.source

    def ps_default_note(self) -> str | None:
        """What ``validate``, ``up``'s first line and ``plan`` say of a PS the file got by
        default (it names no ``roles.ps``); None when the file names its PS count."""
        if not self.ps_by_default:
            return None
        count = self.roles.ps
        return (
            f"{self.source} names no roles.ps, so the cluster gets {count} PS by default; an "
            "all-reduce program (Keras MultiWorkerMirroredStrategy, Horovod) has no PS role: "
            f"write roles.ps: 0 (or roles.ps: {count} to keep {'it' if count == 1 else 'them'})"
        )

    def section(self, cls: type[S]) -> S:
        """A backend's section, typed: ``config.section(SshSection)`` (as
        ``RunRecord.part(SshDetails)``). Every file holds every registered backend's section."""
        for value in self.sections.values():
            if type(value) is cls:
                return value
        raise LookupError(
            f"no section of type {cls.__name__} in this cluster file: its backend is not registered"
        )

    def with_section(self, name: str, section: Any) -> ClusterConfig:
        """This config with backend ``name``'s section replaced."""
        return dataclasses.replace(
            self, sections=types.MappingProxyType({**self.sections, name: section})
        )

    @property
    def workdir(self) -> str:
        """The program's working directory, resolved against the cluster file's folder.

        Where the backend runs the program on other machines (ssh) it is a path on the hosts
        (absolute, ``~/...``, or relative to the remote home directory), resolved there by the
        backend, not on this machine."""
        if backends.spec_of(self.backend).workdir_on_hosts:
            return os.path.normpath(self.program.workdir)
        return os.path.normpath(
            os.path.join(self.base_dir, os.path.expanduser(self.program.workdir))
        )


def load_config(path: str | os.PathLike) -> ClusterConfig:
    """Read and validate a cluster file."""
    path = Path(path)
    return parse_config(read_config_text(path), str(path), str(path.resolve().parent))


def read_config_text(path: Path) -> str:
    """A cluster file's text, read once with the bounds every reader keeps (size, encoding)."""
    if path.is_dir():
        raise ConfigError(
            f"{path}: is a directory, not a cluster file; give the YAML file (e.g. "
            f"{path / 'cluster.yaml'})."
        )
    try:
        with path.open("rb") as f:
            raw = f.read(yamlfile.MAX_FILE_BYTES + 1)
    except OSError as err:
        raise ConfigError(
            f"{path}: cannot read the cluster file ({err.strerror}). "
            "Check the path and its permissions."
        ) from err
    try:
        return yamlfile.decode(raw)
    except yamlfile.YamlFileError as err:
        raise ConfigError(_file_error(str(path), err)) from None


def parse_config(text: str, source: str = "<string>", base_dir: str = ".") -> ClusterConfig:
    """Validate cluster-file text; errors are ConfigError naming source:line and the key path."""
    try:
        data, positions = yamlfile.load(text)
    except yamlfile.YamlFileError as err:
        raise ConfigError(_file_error(source, err)) from None
    if data is None:
        raise ConfigError(
            f"{source}: the cluster file is empty. It needs at least a 'program:' "
            "(see examples/local.yaml)."
        )
    if isinstance(data, dict) and "cluster" in data and "program" not in data:
        raise ConfigError(
            _located(
                source,
                positions,
                ("cluster",),
                "this is a sweep file for 'tflaunch bench' (it names its cluster file under "
                f"'cluster:'), not a cluster file: run 'tflaunch bench {source}' "
                "(--dry-run lists its grid), or validate the cluster file it names",
            )
        )
    try:
        config = schema.read(ClusterConfig, data, sections=backends.sections())
    except schema.SchemaError as err:
        raise ConfigError(_located(source, positions, err.path, err.message)) from None
    roles = data.get("roles") if isinstance(data, dict) else None
    ps_by_default = config.roles.ps > 0 and not (isinstance(roles, dict) and "ps" in roles)
    ports = data.get("ports") if isinstance(data, dict) else None
    config = dataclasses.replace(
        config,
        source=source,
        base_dir=base_dir,
        ps_by_default=ps_by_default,
        ports_pinned=frozenset(ports) if isinstance(ports, dict) else frozenset(),
        positions=types.MappingProxyType(positions),
    )
    _check(config, positions)
    return config


def _file_error(source: str, err: yamlfile.YamlFileError) -> str:
    where = f"{source}:{err.line}" if err.line else source
    return f"{where}: {err.message}."


def _located(source: str, positions: Mapping[tuple, int], path: tuple, message: str) -> str:
    line = _line_of(positions, path)
    where = f"{source}:{line}" if line else source
    return f"{where}: {schema.format_path(path)}: {message}."


def _line_of(positions: Mapping[tuple, int], path: tuple) -> int | None:
    while path:
        if path in positions:
            return positions[path]
        path = path[:-1]
    return positions.get((), None)


def _check(config: ClusterConfig, positions: Mapping[tuple, int]) -> None:
    """Cross-field rules that a per-field type cannot express."""

    def fail(path: tuple, message: str) -> None:
        raise ConfigError(_located(config.source, positions, path, message))

    if not config.program.argv:
        fail(("program", "argv"), "is empty; give the command to run, e.g. [python, train.py]")
    if not NAME_START.match(config.name):
        fail(
            ("name",),
            f"{config.name!r} must start with a letter or a digit: it starts every run id, "
            "which commands take as an argument (e.g. name: my-cluster)",
        )
    moved = _moved_module(config)
    if moved:
        index, old = moved
        fail(
            ("program", "argv", index),
            f"the module '{old}' is now 'tflaunch.{old}' (tflaunch installs only tflaunch-prefixed "
            f"packages, so that a project's own '{old.split('.')[0]}/' is never shadowed); write "
            f"'-m tflaunch.{old}'",
        )
    namespace = namespace_problem(config.kubernetes.namespace)
    if namespace:
        fail(("kubernetes", "namespace"), namespace)
    roles = config.roles
    if roles.chief > 1:
        fail(("roles", "chief"), f"at most one chief, got {roles.chief}")
    if roles.evaluator > 1:
        fail(("roles", "evaluator"), f"at most one evaluator, got {roles.evaluator}")
    if roles.worker + roles.chief == 0:
        fail(("roles", "worker"), "the cluster needs at least one worker or a chief")
    if roles.evaluator and not roles.chief:
        fail(
            ("roles", "evaluator"),
            "an evaluator needs a chief (set roles.chief: 1): "
            "TF_CONFIG's evaluator watches the checkpoints the chief writes",
        )
    pattern = config.supervision.step_pattern
    try:
        groups = re.compile(pattern).groups
    except re.error as err:
        fail(("supervision", "step_pattern"), f"is not a valid regular expression ({err})")
    if groups < 1:
        fail(
            ("supervision", "step_pattern"),
            f"{pattern!r} has no group; put the step number in parentheses, e.g. 'step (\\d+)'",
        )
    if config.supervision.rate_pattern:
        try:
            rate_groups = re.compile(config.supervision.rate_pattern).groups
        except re.error as err:
            fail(("supervision", "rate_pattern"), f"is not a valid regular expression ({err})")
        if rate_groups < 1:
            fail(
                ("supervision", "rate_pattern"),
                "has no group; put the number in parentheses, e.g. 'images/sec: ([\\d.]+)'",
            )
    total = roles.ps + roles.worker + roles.chief + roles.evaluator
    if total > MAX_TASKS:
        fail(("roles",), f"{total} tasks in all; at most {MAX_TASKS:,} are allowed")
    first_at: dict[str, int] = {}
    for i, host in enumerate(config.hosts):
        if host.name in first_at:
            fail(("hosts", i, "name"), f"host '{host.name}' is listed twice")
        first_at[host.name] = i
    _check_env(config, fail)
    supervision = config.supervision
    if supervision.heartbeat * 2 > supervision.heartbeat_timeout:
        fail(
            ("supervision", "heartbeat_timeout"),
            f"{supervision.heartbeat_timeout:g} s is less than twice the heartbeat "
            f"({supervision.heartbeat:g} s), so one late heartbeat would tear the run down; "
            "raise heartbeat_timeout or lower heartbeat",
        )
    for spec in backends.BACKENDS.specs().values():  # each backend's section, and its own rules
        if spec.check is not None:
            spec.check(config, fail)


def _check_env(config: ClusterConfig, fail: Any) -> None:
    """Environment names are POSIX names (a key such as ``X; touch f #`` or ``A=B`` would be
    shell or a second assignment wherever it is exported). Whether the backend can deliver
    env_from is the backend's own check."""
    program = config.program
    for key in program.env:
        problem = env_name_problem(key)
        if problem:
            fail(("program", "env", key), problem)
    if program.keras == "legacy" and program.env.get(LEGACY_KERAS_ENV, "1") != "1":
        fail(
            ("program", "env", LEGACY_KERAS_ENV),
            f"is {program.env[LEGACY_KERAS_ENV]!r}, but program.keras: legacy sets it to 1; "
            "keep one of the two",
        )
    for i, name in enumerate(program.env_from):
        problem = env_name_problem(name)
        if problem:
            fail(("program", "env_from", i), problem)
        if name in program.env:
            fail(("program", "env_from", i), f"'{name}' is also set in program.env; keep one")
        if name in program.env_from[:i]:
            fail(("program", "env_from", i), f"'{name}' is listed twice")


def _moved_module(config: ClusterConfig) -> tuple[int, str] | None:
    """An argv running one of our programs by its pre-0.2 name (``-m models.mnist``), unless the
    program's workdir has a module of that name of its own."""
    argv = config.program.argv
    for i in range(1, len(argv)):
        old = argv[i]
        if argv[i - 1] != "-m" or old.split(".")[0] not in ("models", "launchers"):
            continue
        own = Path(config.workdir, *old.split("."))
        if own.with_suffix(".py").exists() or own.is_dir():
            return None
        if importlib.util.find_spec(f"tflaunch.{old.split('.')[0]}") and _has_module(
            f"tflaunch.{old}"
        ):
            return i, old
    return None


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def config_schema() -> dict:
    """The JSON Schema of the cluster file, with every registered backend's section."""
    return schema.json_schema(
        ClusterConfig, title="tflaunch cluster file", sections=backends.sections()
    )
