"""A campaign as a KubeRay RayJob (or RayCronJob), sized from its plan (`raysweep kuberay CAMPAIGN`).

The manifest holds up to four documents, applied together with `kubectl apply -f`:
- a PersistentVolumeClaim (`ReadWriteMany`, mounted at /shared on every pod): the ledger and results at
  /shared/results/NAME, and the model cache. It is not owned by the job, so it outlives it: a RayJob deleted or
  failed part way and applied again runs `raysweep run` on the same ledger, which resumes (done points are never
  run again);
- a ConfigMap with the campaign file and the files it names by relative paths (parameter files, data set files),
  at the same relative places, as `raysweep submit` ships them;
- the RayJob: a Ray cluster made for the job (a head without GPUs for the driver and the clients, one worker group
  of `nodes` pods with the GPUs of the largest placement each), or `clusterSelector` for a RayCluster that runs
  already; `shutdownAfterJobFinishes`, `ttlSecondsAfterFinished`, `submissionMode`, `activeDeadlineSeconds` from
  the plan's estimate, `backoffLimit`, and Kueue's `kueue.x-k8s.io/queue-name` label for gang admission;
- or a RayCronJob (`schedule`) whose `jobTemplate` is that RayJob's spec, for a campaign run every night: each
  night's run writes to OUTPUT_DIR/YYYY-MM-DD (the UTC day it starts: a retry the same day resumes it), or, with
  `--same-dir`, every run resumes the one ledger in OUTPUT_DIR.

The campaign's files reach the job two ways. With a cluster of its own, the ConfigMap is mounted in the head pod
and the entrypoint changes into it. With `clusterSelector` (a cluster that runs already, whose pods cannot take a
new volume), the submitter pod mounts it and `ray job submit` uploads it as the job's `working_dir`: K8sJobMode
only. Nothing here talks to a Kubernetes API server: the manifests are data, checked against KubeRay's published
CRD schemas in the test suite.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from raysweep.errors import UserError
from raysweep.place import sizing

__all__ = ["KubeJob", "MARGIN", "START_S", "deadline_s", "manifests", "parse_duration", "render"]

START_S = 600.0        # pods scheduled, images pulled, Ray up on every pod: on top of the campaign's estimate
MARGIN = sizing.MARGIN # the estimate is a guess
SHARED = "/shared"     # the claim's mount point on every pod (as in cluster/kuberay-raycluster.yaml)
CAMPAIGN_DIR = "/etc/raysweep/campaign"
SUBMISSION_MODES = ("K8sJobMode", "HTTPMode", "SidecarMode")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MAX_NAME = 47          # KubeRay: a RayJob's name, so that its RayCluster's name stays valid (MaxRayJobNameLength)
MAX_CRON_NAME = 36     # KubeRay: a RayCronJob's name, so that its RayJobs' names stay valid
CONFIGMAP_MAX = 1_000_000   # Kubernetes keeps an object under 1 MiB
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_CRON_FIELD = re.compile(r"[0-9*/,\-A-Za-z?]+")


@dataclass
class KubeJob:
    name: str                         # DNS-1035: the RayJob's (and its ConfigMap's) name
    campaign: str                     # the campaign file, relative to the ConfigMap's root
    files: dict[str, str]             # relative path -> text: the campaign and the files it names
    output_dir: str                   # absolute, under SHARED
    image: str
    nodes: int                        # worker pods
    gpus_per_node: int                # GPUs of each worker pod (0: CPU only)
    deadline_s: int                   # activeDeadlineSeconds
    namespace: str | None = None
    worker_cpus: str = "32"
    worker_memory: str = "256Gi"
    head_cpus: str = "8"
    head_memory: str = "32Gi"
    pvc: str = "raysweep-shared"
    make_pvc: bool = True
    storage_class: str | None = None
    pvc_size: str = "1Ti"
    cluster_selector: str | None = None
    queue: str | None = None
    submission_mode: str = "K8sJobMode"
    shutdown: bool = True
    ttl_s: int = 600
    backoff_limit: int = 1
    schedule: str | None = None
    time_zone: str | None = None
    env_vars: dict[str, str] = field(default_factory=dict)
    ray_labels: dict[str, str] = field(default_factory=dict)
    ray_resources: dict[str, float] = field(default_factory=dict)
    retry_failed: bool = False
    dated: bool = False               # a RayCronJob's runs each in OUTPUT_DIR/YYYY-MM-DD (UTC, the day it starts)
    why: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------
# Sizes from the plan
# ---------------------------------------------------------------------------------------------------

def deadline_s(estimate_s: float) -> int:
    """activeDeadlineSeconds from the plan's estimate: with a margin and the pods' start, in whole minutes."""
    return sizing.time_s(estimate_s, START_S)


def parse_duration(text: str, option: str = "--time") -> int:
    """Seconds from `90` (minutes), `MM:SS`, `HH:MM:SS`, `D-HH:MM:SS` or `2h`, `45m`, `600s`."""
    return sizing.parse_duration(text, option, "a campaign's pods alone take longer to start")


# ---------------------------------------------------------------------------------------------------
# Checks of the options (before anything is written)
# ---------------------------------------------------------------------------------------------------

def check(job: KubeJob) -> None:
    """Every option that KubeRay, Kueue or Kubernetes would refuse, refused here with the option named."""
    limit = MAX_CRON_NAME if job.schedule else MAX_NAME
    what = "a RayCronJob's" if job.schedule else "a RayJob's"
    if not _DNS1035.fullmatch(job.name) or len(job.name) > limit:
        raise UserError(f"--name: {job.name!r} is not accepted as {what} name: lower-case letters, digits and '-', "
                        f"starting with a letter, at most {limit} characters")
    if job.namespace is not None and (not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", job.namespace)
                                      or len(job.namespace) > 63):
        raise UserError(f"--namespace: {job.namespace!r} is not a Kubernetes namespace name (lower-case letters, "
                        "digits and '-', at most 63 characters)")
    if not re.fullmatch(r"[a-z0-9]([-.a-z0-9]*[a-z0-9])?", job.pvc) or len(job.pvc) > 253:
        raise UserError(f"--pvc: {job.pvc!r} is not a claim name (lower-case letters, digits, '-' and '.')")
    if job.submission_mode not in SUBMISSION_MODES:
        raise UserError(f"--submission-mode: {job.submission_mode!r} is not accepted: one of "
                        + ", ".join(SUBMISSION_MODES))
    if job.queue is not None:
        if not re.fullmatch(r"[a-z0-9]([-.a-z0-9]*[a-z0-9])?", job.queue) or len(job.queue) > 63:
            raise UserError(f"--queue: {job.queue!r} is not a Kueue LocalQueue name")
        if job.cluster_selector:
            raise UserError("--queue: Kueue admits a RayJob with a cluster of its own, not one with --cluster-selector "
                            "(the running cluster's pods were admitted already)")
        if not job.shutdown:
            raise UserError("--queue: Kueue needs the cluster shut down when the job finishes; drop --keep-cluster")
    if job.cluster_selector is not None:
        if not _DNS1035.fullmatch(job.cluster_selector):
            raise UserError(f"--cluster-selector: {job.cluster_selector!r} is not a RayCluster name")
        if job.submission_mode != "K8sJobMode":
            raise UserError(f"--submission-mode: {job.submission_mode} cannot carry the campaign's files to a cluster "
                            "that runs already (--cluster-selector): use K8sJobMode, whose submitter uploads them")
    if job.schedule is not None:
        fields = job.schedule.split()
        if job.schedule.startswith("@"):
            if job.schedule not in ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"):
                raise UserError(f"--schedule: {job.schedule!r} is not accepted: five cron fields "
                                "(minute hour day month weekday), or @daily, @hourly, @weekly, ...")
        elif len(fields) != 5 or not all(_CRON_FIELD.fullmatch(f) for f in fields) or "TZ" in job.schedule:
            raise UserError(f"--schedule: {job.schedule!r} is not accepted: five cron fields (minute hour day month "
                            "weekday), e.g. \"0 2 * * *\" for 02:00 every day; a time zone goes in --time-zone")
    if job.time_zone is not None and not re.fullmatch(r"[A-Za-z_]+(/[A-Za-z0-9_+\-]+)*|UTC", job.time_zone):
        raise UserError(f"--time-zone: {job.time_zone!r} is not an IANA time zone name (e.g. Europe/Paris, UTC)")
    if job.time_zone is not None and job.schedule is None:
        raise UserError("--time-zone: only with --schedule (a RayCronJob)")
    for opt, value in (("--worker-cpus", job.worker_cpus), ("--head-cpus", job.head_cpus)):
        if not re.fullmatch(r"\d+(\.\d+)?|\d+m", value):
            raise UserError(f"{opt}: {value!r} is not a CPU quantity (e.g. 16, 0.5, 500m)")
    for opt, value in (("--worker-memory", job.worker_memory), ("--head-memory", job.head_memory),
                       ("--pvc-size", job.pvc_size)):
        if not re.fullmatch(r"\d+(\.\d+)?([KMGTPE]i?|[kmgtpe])?", value):
            raise UserError(f"{opt}: {value!r} is not a Kubernetes quantity (e.g. 256Gi, 64G)")
    size_all = sum(len(k) + len(v.encode()) for k, v in job.files.items())
    if size_all > CONFIGMAP_MAX:
        raise UserError(f"CAMPAIGN: the campaign and the files it names take {size_all / 1e6:.1f} MB, more than a "
                        "ConfigMap holds (1 MiB): put data sets on the claim and name them by absolute paths under "
                        f"{SHARED}")


# ---------------------------------------------------------------------------------------------------
# The manifests
# ---------------------------------------------------------------------------------------------------

def _meta(job: KubeJob, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if job.namespace:
        meta["namespace"] = job.namespace
    meta["labels"] = {"app.kubernetes.io/name": "raysweep", "app.kubernetes.io/component": "campaign",
                      **(labels or {})}
    return meta


def _env() -> list[dict[str, Any]]:
    return [{"name": "RAY_USAGE_STATS_ENABLED", "value": "0"},
            {"name": "RAY_worker_niceness", "value": "0"},     # vLLM servers at nice 0, not Ray's 15
            {"name": "HF_HOME", "value": f"{SHARED}/hf-cache"},
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token",
                                                                "optional": True}}}]


def _config_map_volume(job: KubeJob) -> dict[str, Any]:
    return {"name": "campaign", "configMap": {"name": f"{job.name}-campaign",
                                              "items": [{"key": _key(p), "path": p} for p in sorted(job.files)]}}


def _key(path: str) -> str:
    """A ConfigMap key for a relative path (keys allow letters, digits, '-', '_' and '.')."""
    return re.sub(r"[^-._a-zA-Z0-9]", "_", path.replace("/", "__"))


def _resources(cpu: str, memory: str, gpus: int = 0) -> dict[str, Any]:
    want: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if gpus:
        want["nvidia.com/gpu"] = str(gpus)
    return {"requests": dict(want), "limits": dict(want)}


def _cluster_spec(job: KubeJob) -> dict[str, Any]:
    shared = {"name": "shared", "persistentVolumeClaim": {"claimName": job.pvc}}
    dshm = {"name": "dshm", "emptyDir": {"medium": "Memory"}}
    mounts = [{"name": "shared", "mountPath": SHARED}, {"name": "dshm", "mountPath": "/dev/shm"}]
    head = {
        "rayStartParams": {"dashboard-host": "0.0.0.0", "num-gpus": "0"},   # no server on the head
        "template": {"spec": {
            "containers": [{
                "name": "ray-head", "image": job.image, "env": _env(),
                "ports": [{"containerPort": 6379, "name": "gcs-server"}, {"containerPort": 8265, "name": "dashboard"},
                          {"containerPort": 10001, "name": "client"}],
                "resources": _resources(job.head_cpus, job.head_memory),
                "volumeMounts": [*mounts, {"name": "campaign", "mountPath": CAMPAIGN_DIR, "readOnly": True}]}],
            "volumes": [shared, dshm, _config_map_volume(job)]}},
    }
    worker_spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 60,
        "containers": [{"name": "ray-worker", "image": job.image, "env": _env(),
                        "resources": _resources(job.worker_cpus, job.worker_memory, job.gpus_per_node),
                        "volumeMounts": mounts}],
        "volumes": [shared, dshm]}
    if job.gpus_per_node:
        worker_spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    worker: dict[str, Any] = {"groupName": "gpu" if job.gpus_per_node else "cpu", "replicas": job.nodes,
                              "minReplicas": job.nodes, "maxReplicas": job.nodes, "rayStartParams": {},
                              "template": {"spec": worker_spec}}
    if job.ray_labels:
        worker["labels"] = dict(job.ray_labels)
    if job.ray_resources:
        worker["resources"] = {k: f"{v:g}" for k, v in job.ray_resources.items()}
    return {"rayVersion": "2.60.0", "authOptions": {"mode": "token"}, "enableInTreeAutoscaling": False,
            "headGroupSpec": head, "workerGroupSpecs": [worker]}


def entrypoint(job: KubeJob) -> str:
    """`raysweep run` on the cluster's head: it resumes the ledger it finds in the output dir."""
    out = _q(job.output_dir) + ('/"$(date -u +%F)"' if job.dated else "")   # the shell of the job expands it
    run = f"raysweep run {_q(job.campaign)} --address auto --output-dir {out}"
    if job.retry_failed:
        run += " --retry-failed"
    return run if job.cluster_selector else f"cd {CAMPAIGN_DIR} && {run}"


def _q(s: str) -> str:
    import shlex

    return shlex.quote(s)


def job_spec(job: KubeJob) -> dict[str, Any]:
    env_vars = {"RAY_JOB_STOP_WAIT_TIME_S": "120", **job.env_vars}
    runtime: dict[str, Any] = {"env_vars": env_vars}
    spec: dict[str, Any] = {"entrypoint": entrypoint(job), "submissionMode": job.submission_mode,
                            "activeDeadlineSeconds": job.deadline_s}
    if job.cluster_selector:
        runtime["working_dir"] = CAMPAIGN_DIR        # uploaded by `ray job submit` from the submitter pod
        spec["clusterSelector"] = {"ray.io/cluster": job.cluster_selector}
        spec["submitterPodTemplate"] = {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "ray-job-submitter", "image": job.image,
                            "resources": _resources("500m", "1Gi"),
                            "volumeMounts": [{"name": "campaign", "mountPath": CAMPAIGN_DIR, "readOnly": True}]}],
            "volumes": [_config_map_volume(job)]}}
    else:
        spec["rayClusterSpec"] = _cluster_spec(job)
        spec["shutdownAfterJobFinishes"] = job.shutdown
        spec["backoffLimit"] = job.backoff_limit
        if job.shutdown:
            spec["ttlSecondsAfterFinished"] = job.ttl_s
    spec["runtimeEnvYAML"] = yaml.safe_dump(runtime, sort_keys=True)
    return spec


def manifests(job: KubeJob) -> list[dict[str, Any]]:
    """The documents to apply, in order: the claim (unless it exists), the campaign's ConfigMap, the (cron) job."""
    check(job)
    docs: list[dict[str, Any]] = []
    if job.make_pvc:
        pvc_spec: dict[str, Any] = {"accessModes": ["ReadWriteMany"],
                                    "resources": {"requests": {"storage": job.pvc_size}}}
        if job.storage_class:
            pvc_spec["storageClassName"] = job.storage_class
        docs.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(job, job.pvc),
                     "spec": pvc_spec})
    docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(job, f"{job.name}-campaign"),
                 "data": {_key(p): text for p, text in sorted(job.files.items())}})
    labels = {QUEUE_LABEL: job.queue} if job.queue else {}
    if job.schedule is None:
        docs.append({"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": _meta(job, job.name, labels),
                     "spec": job_spec(job)})
    else:
        cron: dict[str, Any] = {"schedule": job.schedule, "jobTemplate": job_spec(job)}
        if job.time_zone:
            cron["timeZone"] = job.time_zone
        meta = _meta(job, job.name, labels)
        docs.append({"apiVersion": "ray.io/v1", "kind": "RayCronJob", "metadata": meta, "spec": cron})
    return docs


def render(job: KubeJob) -> str:
    """The manifests as one YAML stream, with a header saying how each size was chosen and how to apply it."""
    docs = manifests(job)
    kind = "RayCronJob" if job.schedule else "RayJob"
    ns = f" -n {job.namespace}" if job.namespace else ""
    head = [f"# raysweep campaign as a KubeRay {kind} (`raysweep kuberay`), from the campaign's plan:",
            *(f"#   {w}" for w in job.why),
            "#",
            "# Apply (KubeRay operator >= 1.5; RayCronJob needs >= 1.7 with its feature gate RayCronJob on):",
            f"#   kubectl apply{ns} -f THIS_FILE",
            f"#   kubectl get {kind.lower()}{ns} {job.name}            # status",
            f"# Results: {job.output_dir} on the claim {job.pvc}, which stays after the job is deleted;",
            "# applying this file again resumes the campaign (finished points are never run twice).",
            "# Secrets the campaign names (HF_TOKEN): kubectl create secret generic hf-token --from-literal=token=...",
            ""]
    body = "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)
                         for d in docs)
    return "\n".join(head) + "---\n" + body


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the campaign's files, the runtime env) as literal blocks, readable as they were written."""


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str)


def files_of(root: Path) -> dict[str, str]:
    """Every file under a staged campaign directory, by its path relative to it (text)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            rel = p.relative_to(root).as_posix()
            try:
                out[rel] = p.read_text()
            except UnicodeDecodeError:
                raise UserError(f"CAMPAIGN: {rel} is not a text file; a ConfigMap carries text: put it on the claim "
                                f"and name it by an absolute path under {SHARED}") from None
    return out
