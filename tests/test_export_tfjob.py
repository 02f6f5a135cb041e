"""``tflaunch export --format tfjob``: manifests checked against the TFJob CRD's OpenAPI v3 schema
(kubeflow/training-operator, stored in tests/data/ with its source), and what a TFJob cannot
express refused with a message naming the key."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from tests.helpers import ROOT
from tflaunch.cli import cli

CRD = Path(__file__).parent / "data" / "kubeflow.org_tfjobs.v1.excerpt.yaml"

DEDICATED_GPU = """\
name: Daint_GPU-16
backend: slurm
program:
  argv: [python3, -m, tflaunch.models.benchmark, --job_name, "{job_name}",
         --task_index, "{task_index}", --ps_hosts, "{ps_hosts}", "--note=cost $5 {host}:{port}"]
  env: {OMP_NUM_THREADS: "4"}
roles: {ps: 2, worker: 8}
placement: {ps: dedicated, workers_per_host: 4}
slurm: {gpus_per_node: 4}
kubernetes: {image: "registry.example/tf:2.21-gpu", namespace: ml, gpu_resource: nvidia.com/gpu}
"""


def crd_schema() -> dict:
    (version,) = yaml.safe_load(CRD.read_text())["spec"]["versions"]
    assert version["name"] == "v1"
    return version["schema"]["openAPIV3Schema"]


def unknown_fields(value, schema: dict, path: str = "") -> list[str]:
    """Properties the schema does not name (structural schemas prune them; strict field
    validation refuses them): every object with ``properties`` and no
    ``additionalProperties`` is closed."""
    found = []
    if isinstance(value, dict) and schema.get("type") == "object":
        known = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if known is not None and key in known:
                found += unknown_fields(item, known[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                found += unknown_fields(item, extra, f"{path}.{key}")
            elif known is not None:
                found.append(f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return found


def export(*args: str) -> dict:
    result = CliRunner().invoke(cli, ["export", *args, "--format", "tfjob"])
    assert result.exit_code == 0, result.output
    return yaml.safe_load(result.stdout)


def check(manifest: dict) -> None:
    schema = crd_schema()
    jsonschema.Draft7Validator(schema).validate(manifest)
    assert unknown_fields(manifest, schema) == []
    assert (manifest["apiVersion"], manifest["kind"]) == ("kubeflow.org/v1", "TFJob")
    for spec in manifest["spec"]["tfReplicaSpecs"].values():
        assert spec["restartPolicy"] in ("Always", "OnFailure", "Never", "ExitCode")
        (container,) = spec["template"]["spec"]["containers"]
        assert container["name"] == "tensorflow"  # where the operator puts TF_CONFIG


def test_the_checker_catches_what_the_schema_refuses():
    manifest = export(str(ROOT / "examples" / "local.yaml"), "--image", "tf")
    manifest["spec"]["tfReplicaSpecs"]["PS"]["replicas"] = "one"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(crd_schema()).validate(manifest)
    manifest["spec"]["tfReplicaSpecs"]["PS"]["template"]["spec"]["hostNetwork"] = True
    assert unknown_fields(manifest, crd_schema()) == [
        ".spec.tfReplicaSpecs.PS.template.spec.hostNetwork"
    ]


def test_local_example_as_a_tfjob_with_placeholders_as_tf_config_gives_them():
    manifest = export(str(ROOT / "examples" / "local.yaml"), "--image", "tf:2.21")
    check(manifest)
    specs = manifest["spec"]["tfReplicaSpecs"]
    assert list(specs) == ["PS", "Worker"] and specs["Worker"]["replicas"] == 2
    assert manifest["spec"]["successPolicy"] == "AllWorkers"  # supervision.success: workers
    worker = specs["Worker"]["template"]["spec"]["containers"][0]
    assert worker["command"][3:] == [
        "--job_name",
        "worker",
        "--task_index",
        "$(TFLAUNCH_TASK_INDEX)",
        "--ps_hosts",
        "mnist-local-ps-0.default.svc:2230",
        "--worker_hosts",
        "mnist-local-worker-0.default.svc:2220,mnist-local-worker-1.default.svc:2220",
    ]
    assert worker["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['training.kubeflow.org/replica-index']"
    )
    assert worker["ports"] == [{"name": "tfjob-port", "containerPort": 2220}]
    assert specs["PS"]["restartPolicy"] == "Never" and "resources" not in worker


def test_pss_example_maps_restart_policies_and_warns_about_what_only_tflaunch_watches():
    result = CliRunner().invoke(
        cli,
        ["export", str(ROOT / "examples" / "pss.yaml"), "--format", "tfjob", "--image", "tf"]
        + ["--checkpoint-dir", "/ckpt"],
    )
    assert result.exit_code == 0, result.output
    manifest = yaml.safe_load(result.stdout)
    check(manifest)
    specs = manifest["spec"]["tfReplicaSpecs"]
    assert {k: s["restartPolicy"] for k, s in specs.items()} == {
        "PS": "ExitCode",
        "Chief": "ExitCode",
        "Worker": "OnFailure",
    }
    assert "successPolicy" not in manifest["spec"]  # success: chief is TFJob's default
    assert specs["Chief"]["template"]["spec"]["containers"][0]["command"][-1] == "/ckpt"
    assert "supervision.stall_timeout is watched by tflaunch's launcher" in result.stderr
    assert "the TFJob restarts the ps pod alone (ExitCode)" in result.stderr


def test_dedicated_ps_gpu_cluster_gets_gpu_limits_on_workers_only(tmp_path):
    (tmp_path / "gpu.yaml").write_text(DEDICATED_GPU)
    manifest = export(str(tmp_path / "gpu.yaml"))
    check(manifest)
    assert manifest["metadata"] == {"name": "daint-gpu-16", "namespace": "ml"}
    specs = manifest["spec"]["tfReplicaSpecs"]
    worker = specs["Worker"]["template"]["spec"]["containers"][0]
    ps = specs["PS"]["template"]["spec"]["containers"][0]
    assert worker["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert "resources" not in ps and specs["Worker"]["replicas"] == 8
    # $ is Kubernetes' expansion character: a literal one is doubled; {host} is the pod's own
    assert worker["command"][-1] == (
        "--note=cost $$5 daint-gpu-16-worker-$(TFLAUNCH_TASK_INDEX).ml.svc:2220"
    )
    assert {"name": "OMP_NUM_THREADS", "value": "4"} in worker["env"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("", "a TFJob needs a container image; set kubernetes.image"),
        (
            "kubernetes: {image: i}\nprogram: [python3, t.py, '{cluster_file}']\n",
            "program.argv: '{cluster_file}' names a file in tflaunch's run directory",
        ),
        (
            "kubernetes: {image: i}\nprogram: {argv: [python3], env_from: [TOKEN]}\n",
            "program.env_from: its values must never be written to a file",
        ),
        (
            "kubernetes: {image: i}\nsupervision: {restart: {worker: {policy: on-failure, "
            "scope: cluster}}}\n",
            "supervision.restart.worker.scope: cluster: TFJob restarts a failed pod alone",
        ),
        (
            "kubernetes: {image: i}\nprogram: [python3, t.py, '{checkpoint_dir}']\n",
            "set kubernetes.checkpoint_dir (or an absolute program.checkpoint_dir)",
        ),
        (
            "kubernetes: {image: i}\nhosts: [{name: a, gpus: 2}, {name: b, gpus: 0}]\n"
            "roles: {ps: 1, worker: 2}\nplacement: {workers_per_host: 1}\n",
            "the plan gives worker tasks 0 or 2 GPUs",
        ),
    ],
)
def test_what_a_tfjob_cannot_express_is_an_error_naming_the_key(tmp_path, extra, message):
    text = "name: t\n" + (extra if "program" in extra else extra + "program: [python3, t.py]\n")
    (tmp_path / "c.yaml").write_text(text)
    result = CliRunner().invoke(cli, ["export", str(tmp_path / "c.yaml"), "--format", "tfjob"])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("namespace", ["Team", "-x", "x-", "a_b", "a.b", "x" * 64, "kube system"])
def test_a_namespace_must_be_a_kubernetes_name_in_the_file_and_as_an_option(tmp_path, namespace):
    path = tmp_path / "c.yaml"
    path.write_text(f"name: t\nprogram: [p]\nkubernetes: {{image: i, namespace: '{namespace}'}}\n")
    from_file = CliRunner().invoke(cli, ["export", str(path), "--format", "tfjob"])
    assert from_file.exit_code == 2 and "Traceback" not in from_file.output
    assert f"c.yaml:3: kubernetes.namespace: {namespace!r} is not a Kubernetes namespace" in (
        from_file.output
    )
    path.write_text("name: t\nprogram: [p]\nkubernetes: {image: i}\n")
    as_option = CliRunner().invoke(
        cli, ["export", str(path), "--format", "tfjob", "--namespace", namespace]
    )
    assert as_option.exit_code == 2 and "--namespace: " in as_option.output
    ok = CliRunner().invoke(cli, ["export", str(path), "--format", "tfjob", "--namespace", "ml-1"])
    assert ok.exit_code == 0 and "namespace: ml-1" in ok.output
