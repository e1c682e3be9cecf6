"""`raysweep kuberay CAMPAIGN`: RayJob and RayCronJob manifests, checked against KubeRay's published CRD schemas.

No Kubernetes API server runs here. The manifests are validated with `jsonschema` against the OpenAPI schemas of
KubeRay v1.7.0's CRDs (tests/fixtures/kuberay, Apache-2.0), made strict as `kubectl apply`'s default field
validation is (an unknown field is an error, not dropped), and against the rules KubeRay's operator adds
(`ValidateRayJobMetadata`, `ValidateRayJobSpec`, `ValidateRayCronJobSpec`) that a schema cannot say.
"""

from __future__ import annotations

import copy
import gzip
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from raysweep.cli import main
from raysweep.place import kuberay as kr

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "kuberay"
IMAGE = "registry.example.com/raysweep:2.60.0-py311-gpu"


@cache
def crd_schema(kind: str) -> dict[str, Any]:
    """The openAPIV3Schema of KubeRay's `kind` CRD (its stored version, v1), strict: an object that lists its
    properties accepts no others (kubectl's default `--validate=strict`), unless it preserves unknown fields."""
    plural = {"RayJob": "rayjobs", "RayCronJob": "raycronjobs"}[kind]
    with gzip.open(FIXTURES / f"ray.io_{plural}.yaml.gz", "rt") as f:
        crd = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    assert crd["spec"]["names"]["kind"] == kind
    (version,) = [v for v in crd["spec"]["versions"] if v["storage"]]
    assert version["name"] == "v1"
    schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])

    def strict(node: Any) -> None:
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                strict(value)
        elif isinstance(node, list):
            for value in node:
                strict(value)
    strict(schema)
    return schema


def crd_errors(doc: dict[str, Any]) -> list[str]:
    """Every way `doc` breaks its CRD's schema, as `path: message`."""
    validator = jsonschema.Draft7Validator(crd_schema(doc["kind"]))
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def operator_errors(doc: dict[str, Any]) -> list[str]:
    """The rules KubeRay v1.7.0's operator checks beyond the schema (its ray-operator/controllers/ray/utils/
    validation.go), and Kueue's for a RayJob it admits."""
    errors = []
    name = doc["metadata"]["name"]
    cron = doc["kind"] == "RayCronJob"
    if len(name) > (36 if cron else 47) or not DNS1035.fullmatch(name):
        errors.append(f"name {name!r}")
    spec = doc["spec"]["jobTemplate"] if cron else doc["spec"]
    if cron and ("TZ" in doc["spec"]["schedule"] or len(doc["spec"]["schedule"].split()) != 5):
        errors.append("schedule")
    if spec.get("suspend") and not spec.get("shutdownAfterJobFinishes"):
        errors.append("suspend without shutdownAfterJobFinishes")
    selector = spec.get("clusterSelector")
    if not spec.get("rayClusterSpec") and not selector:
        errors.append("neither rayClusterSpec nor clusterSelector")
    if selector:
        if not selector.get("ray.io/cluster"):
            errors.append("clusterSelector without ray.io/cluster")
        if spec.get("submissionMode") == "SidecarMode" or (spec.get("backoffLimit") or 0) > 0:
            errors.append("clusterSelector with SidecarMode or backoffLimit")
    sidecar = spec.get("submissionMode") == "SidecarMode"
    if sidecar and (spec.get("submitterPodTemplate") or spec.get("submitterConfig")):
        errors.append("SidecarMode with a submitter template")
    if (spec.get("activeDeadlineSeconds") or 1) <= 0 or (spec.get("ttlSecondsAfterFinished") or 0) < 0:
        errors.append("deadline or ttl")
    yaml.safe_load(spec.get("runtimeEnvYAML") or "{}")
    # Kueue's RayJob integration: the cluster shut down at the end, made for the job, not autoscaled
    if QUEUE in doc["metadata"].get("labels", {}):
        if not spec.get("shutdownAfterJobFinishes") or selector:
            errors.append("Kueue needs shutdownAfterJobFinishes and its own cluster")
        if spec["rayClusterSpec"].get("enableInTreeAutoscaling"):
            errors.append("Kueue refuses autoscaling")
    return errors


QUEUE = "kueue.x-k8s.io/queue-name"


def kube(tmp_path: Path, campaign: Path | str, *args: str) -> tuple[int, str, list[dict[str, Any]]]:
    """Run `raysweep kuberay`; (exit code, output, the documents written)."""
    out = tmp_path / "manifest.yaml"
    res = CliRunner().invoke(main, ["kuberay", str(campaign), "--image", IMAGE, "-o", str(out), *args])
    docs = list(yaml.safe_load_all(out.read_text())) if out.exists() else []
    return res.exit_code, res.output, docs


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in docs}


def pod_specs(job_spec: dict[str, Any]) -> list[dict[str, Any]]:
    rcs = job_spec["rayClusterSpec"]
    return [rcs["headGroupSpec"]["template"]["spec"], *(g["template"]["spec"] for g in rcs["workerGroupSpecs"])]


def test_the_rayjob_of_a_multinode_campaign_is_sized_from_its_plan_and_valid_against_kuberays_crd(tmp_path):
    code, output, docs = kube(tmp_path, ROOT / "configs" / "example-multinode.yaml", "--queue", "team-a")
    assert code == 0, output
    kinds = by_kind(docs)
    assert list(kinds) == ["PersistentVolumeClaim", "ConfigMap", "RayJob"]
    job = kinds["RayJob"]
    assert crd_errors(job) == [] and operator_errors(job) == []
    spec = job["spec"]
    # TP 8 x PP 2 on 8-GPU nodes: two worker pods of 8 GPUs, a head without GPUs
    (workers,) = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert workers["replicas"] == workers["minReplicas"] == workers["maxReplicas"] == 2
    (container,) = workers["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8" and container["image"] == IMAGE
    head = spec["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    assert "nvidia.com/gpu" not in head["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert spec["rayClusterSpec"]["enableInTreeAutoscaling"] is False
    # the batch job's life: Kueue admits it whole, the cluster goes when it ends, a deadline from the estimate
    assert job["metadata"]["labels"][QUEUE] == "team-a"
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] == 600
    assert spec["submissionMode"] == "K8sJobMode" and spec["backoffLimit"] == 1
    from raysweep.campaign import load_campaign
    from raysweep.plan.estimate import estimate
    from raysweep.plan.plan import build_plan

    est = estimate(build_plan(load_campaign(ROOT / "configs" / "example-multinode.yaml")))
    assert spec["activeDeadlineSeconds"] == kr.deadline_s(est.wall_s) > est.wall_s * kr.MARGIN
    # the ledger on the claim, on every pod; the entrypoint `raysweep run`, which resumes it
    pvc = kinds["PersistentVolumeClaim"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    for pod in pod_specs(spec):
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                  if "persistentVolumeClaim" in v}
        assert claims == {"shared": pvc["metadata"]["name"]}
        assert {"name": "shared", "mountPath": "/shared"} in pod["containers"][0]["volumeMounts"]
    # (the campaign at its path relative to this directory, as `raysweep submit` ships it)
    assert spec["entrypoint"] == ("cd /etc/raysweep/campaign && raysweep run configs/example-multinode.yaml --address "
                                  "auto --output-dir /shared/results/llama70b-multinode")
    # the campaign travels in the ConfigMap, mounted on the head where the entrypoint reads it
    cm = kinds["ConfigMap"]
    (vol,) = [v for v in pod_specs(spec)[0]["volumes"] if "configMap" in v]
    assert vol["configMap"]["name"] == cm["metadata"]["name"]
    items = {i["path"]: cm["data"][i["key"]] for i in vol["configMap"]["items"]}
    assert items == {"configs/example-multinode.yaml": (ROOT / "configs" / "example-multinode.yaml").read_text()}
    # the campaign's placement rule (ray.io/accelerator-type: H100) is Ray's own label: nothing added to the pods
    assert "labels" not in workers
    assert "2 worker pod(s) x 8 GPU(s)" in output and "team-a" in output


def test_files_the_campaign_names_travel_at_their_relative_places_and_pod_labels_follow_its_rules(tmp_path,
                                                                                                  monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "serve.json").write_text('[{"max_num_seqs": 8}, {"max_num_seqs": 16}]\n')
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({
        "name": "Nightly_Sweep.v2", "runs": 1,
        "serve": {"cmd": "vllm serve m --tensor-parallel-size 4", "params": "params/serve.json"},
        "bench": {"backend": "command", "cmd": "vllm bench serve --model m --num-prompts 10"},
        "placement": {"node_labels": {"rack": "r1"}}}))
    code, output, docs = kube(tmp_path, "c.yaml", "--gpus-per-node", "4", "--nodes", "3", "--namespace", "bench")
    assert code == 0, output
    kinds = by_kind(docs)
    job = kinds["RayJob"]
    assert crd_errors(job) == [] and operator_errors(job) == []
    assert job["metadata"]["name"] == "raysweep-nightly-sweep-v2"
    assert all(d["metadata"]["namespace"] == "bench" for d in docs)
    (vol,) = [v for v in pod_specs(job["spec"])[0]["volumes"] if "configMap" in v]
    items = {i["path"]: kinds["ConfigMap"]["data"][i["key"]] for i in vol["configMap"]["items"]}
    assert items == {"c.yaml": (tmp_path / "c.yaml").read_text(),
                     "params/serve.json": (tmp_path / "params" / "serve.json").read_text()}
    (workers,) = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert workers["replicas"] == 3 and workers["labels"] == {"rack": "r1"}
    assert workers["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"


def test_a_running_raycluster_is_used_by_cluster_selector_with_the_campaign_uploaded_by_the_submitter(tmp_path):
    code, output, docs = kube(tmp_path, ROOT / "configs" / "example-gpu.yaml", "--cluster-selector", "raysweep",
                              "--existing-pvc", "--time", "3:00:00")
    assert code == 0, output
    kinds = by_kind(docs)
    assert list(kinds) == ["ConfigMap", "RayJob"]                  # the claim exists: not written
    job = kinds["RayJob"]
    assert crd_errors(job) == [] and operator_errors(job) == []
    spec = job["spec"]
    assert "rayClusterSpec" not in spec and spec["clusterSelector"] == {"ray.io/cluster": "raysweep"}
    assert spec["activeDeadlineSeconds"] == 3 * 3600
    assert yaml.safe_load(spec["runtimeEnvYAML"])["working_dir"] == "/etc/raysweep/campaign"
    submitter = spec["submitterPodTemplate"]["spec"]
    assert [v["configMap"]["name"] for v in submitter["volumes"]] == [kinds["ConfigMap"]["metadata"]["name"]]
    assert spec["entrypoint"].startswith("raysweep run configs/example-gpu.yaml --address auto --output-dir "
                                         "/shared/results/")


def test_a_nightly_raycronjob_is_valid_against_kuberays_crd_and_resumes_the_same_ledger(tmp_path):
    code, output, docs = kube(tmp_path, ROOT / "configs" / "example-multinode.yaml", "--schedule", "0 2 * * *",
                              "--time-zone", "Europe/Paris", "--retry-failed")
    assert code == 0, output
    cron = by_kind(docs)["RayCronJob"]
    assert crd_errors(cron) == [] and operator_errors(cron) == []
    assert cron["spec"]["schedule"] == "0 2 * * *" and cron["spec"]["timeZone"] == "Europe/Paris"
    tmpl = cron["spec"]["jobTemplate"]
    # each night's run in a directory of its day (the job's shell expands it); a retry the same day resumes it
    assert tmpl["entrypoint"].endswith('--output-dir /shared/results/llama70b-multinode/"$(date -u +%F)" '
                                       "--retry-failed")
    assert tmpl["shutdownAfterJobFinishes"] is True
    # the same template as a RayJob is a valid RayJob
    assert crd_errors({"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "x"}, "spec": tmpl}) == []


def test_the_strict_schema_check_catches_a_misspelt_field_a_wrong_type_and_an_unknown_mode(tmp_path):
    """The check itself can fail: KubeRay's schema, made strict, refuses what a typo would make."""
    code, _, docs = kube(tmp_path, ROOT / "configs" / "example-gpu.yaml")
    assert code == 0
    job = by_kind(docs)["RayJob"]
    bad = copy.deepcopy(job)
    bad["spec"]["shutdownAfterJobFinish"] = bad["spec"].pop("shutdownAfterJobFinishes")
    assert any("shutdownAfterJobFinish" in e for e in crd_errors(bad))
    bad = copy.deepcopy(job)
    bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "2"
    assert any("replicas" in e for e in crd_errors(bad))
    bad = copy.deepcopy(job)
    del bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["groupName"]
    assert any("groupName" in e for e in crd_errors(bad))
    bad = copy.deepcopy(job)
    bad["metadata"]["name"] = "x" * 48
    assert operator_errors(bad)


def test_a_raycronjob_with_same_dir_resumes_one_ledger_every_night(tmp_path):
    code, output, docs = kube(tmp_path, ROOT / "configs" / "example-multinode.yaml", "--schedule", "@daily",
                              "--same-dir")
    assert code == 0, output
    cron = by_kind(docs)["RayCronJob"]
    assert crd_errors(cron) == [] and cron["spec"]["schedule"] == "@daily"
    assert cron["spec"]["jobTemplate"]["entrypoint"].endswith("--output-dir /shared/results/llama70b-multinode")


@pytest.mark.parametrize("args, named", [
    (["--submission-mode", "BatchMode"], "--submission-mode"),
    (["--queue", "q", "--cluster-selector", "raysweep"], "--queue"),
    (["--queue", "q", "--keep-cluster"], "--queue"),
    (["--cluster-selector", "raysweep", "--submission-mode", "HTTPMode"], "--submission-mode"),
    (["--schedule", "every night"], "--schedule"),
    (["--schedule", "CRON_TZ=UTC 0 2 * * *"], "--schedule"),
    (["--time-zone", "Europe/Paris"], "--time-zone"),
    (["--same-dir"], "--same-dir"),
    (["--time", "30s"], "--time"),
    (["--time", "soon"], "--time"),
    (["--gpus-per-node", "4"], "--gpus-per-node"),       # TP 8 never fits a 4-GPU node
    (["--nodes", "1"], "--nodes"),                        # TP 8 x PP 2 needs two 8-GPU pods
    (["--output-dir", "results/x"], "--output-dir"),
    (["--name", "Raysweep_Job"], "--name"),
    (["--name", "r" * 48], "--name"),
    (["--schedule", "0 2 * * *", "--name", "r" * 37], "--name"),
    (["--pvc", "My Claim"], "--pvc"),
    (["--worker-memory", "lots"], "--worker-memory"),
    (["--ttl", "-1"], "--ttl"),
    (["--image", "two words"], "--image"),
])
def test_bad_options_exit_2_naming_the_option_and_write_nothing(tmp_path, args, named):
    code, output, docs = kube(tmp_path, ROOT / "configs" / "example-multinode.yaml", *args)
    assert code == 2, output
    assert named in output and not docs and list(tmp_path.iterdir()) == []


def test_no_image_is_refused_by_click_with_exit_2(tmp_path):
    res = CliRunner().invoke(main, ["kuberay", str(ROOT / "configs" / "example-gpu.yaml"), "-o",
                                    str(tmp_path / "m.yaml")])
    assert res.exit_code == 2 and "--image" in res.output and not (tmp_path / "m.yaml").exists()
