"""`raysweep kuberay CAMPAIGN`: the KubeRay RayJob (or RayCronJob) of a campaign, sized from its plan
(raysweep.place.kuberay)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path, PurePosixPath

import click

from raysweep.cli._common import _say, main
from raysweep.errors import UserError


@main.command("kuberay")
@click.argument("campaign_file", type=click.Path(dir_okay=False))
@click.option("--image", required=True, help="The container image of every pod: raysweep, Ray 2.60 and the vLLM you "
              "benchmark (cluster/kuberay-raycluster.yaml shows how to build it).")
@click.option("--gpus-per-node", default=8, show_default=True, type=int, help="GPUs of one node of your cluster: the "
              "largest configuration is laid out on such nodes, one worker pod per node (0: no GPUs).")
@click.option("--nodes", default=None, type=int, help="Worker pods (default: as many as the largest placement needs; "
              "more let several configurations run at once).")
@click.option("--name", default=None, help="The RayJob's name (default: raysweep- and the campaign's name).")
@click.option("--namespace", default=None, help="Kubernetes namespace of every document (default: kubectl's).")
@click.option("--cluster-selector", default=None, metavar="RAYCLUSTER", help="Run on this RayCluster, which runs "
              "already (e.g. cluster/kuberay-raycluster.yaml's), instead of a cluster made for the job.")
@click.option("--queue", default=None, metavar="LOCALQUEUE", help="Kueue LocalQueue: the label "
              "kueue.x-k8s.io/queue-name, so that Kueue admits the head and every worker at once (gang) or none.")
@click.option("--submission-mode", default="K8sJobMode", show_default=True,
              help="How KubeRay submits the job: K8sJobMode (a submitter pod), HTTPMode, SidecarMode.")
@click.option("--time", "time_limit", default=None, help="activeDeadlineSeconds, as minutes, HH:MM:SS, D-HH:MM:SS or "
              "2h (default: the plan's estimate x 1.5, plus 10 min for the pods' start).")
@click.option("--ttl", default=600, show_default=True, type=int,
              help="ttlSecondsAfterFinished: seconds the finished cluster is kept for inspection.")
@click.option("--keep-cluster", is_flag=True, help="shutdownAfterJobFinishes: false (the cluster stays after the job).")
@click.option("--backoff-limit", default=1, show_default=True, type=int,
              help="Retries of a failed job, each on a new cluster; each resumes the campaign.")
@click.option("--pvc", default="raysweep-shared", show_default=True, help="The PersistentVolumeClaim of the ledger, "
              "results and model cache, mounted at /shared on every pod.")
@click.option("--existing-pvc", is_flag=True, help="The claim exists already: write no PersistentVolumeClaim.")
@click.option("--storage-class", default=None, help="The claim's storage class (one with ReadWriteMany).")
@click.option("--pvc-size", default="1Ti", show_default=True, help="The claim's size.")
@click.option("--worker-cpus", default="32", show_default=True, help="CPUs of each worker pod.")
@click.option("--worker-memory", default="256Gi", show_default=True, help="Memory of each worker pod.")
@click.option("--head-cpus", default="8", show_default=True, help="CPUs of the head pod (the driver and the clients).")
@click.option("--head-memory", default="32Gi", show_default=True, help="Memory of the head pod.")
@click.option("--schedule", default=None, metavar="CRON", help="A RayCronJob on this schedule (\"0 2 * * *\": 02:00 "
              "each day) instead of a RayJob; each run resumes the same ledger.")
@click.option("--time-zone", default=None, help="The schedule's time zone (IANA name; default: the operator's).")
@click.option("--same-dir", is_flag=True, help="With --schedule: every run resumes the one ledger in the output "
              "dir (default: each night's run in OUTPUT_DIR/YYYY-MM-DD, UTC).")
@click.option("--retry-failed", is_flag=True, help="Each run gives failed points a fresh set of attempts.")
@click.option("--output-dir", default=None, help="Where on the claim the campaign writes (an absolute path under "
              "/shared; default: /shared/results/NAME).")
@click.option("-o", "--out", "out", default=None, help="Where to write the manifest (default: CAMPAIGN's name with "
              ".rayjob.yaml in this directory; `-`: standard output).")
def kuberay(campaign_file: str, image: str, gpus_per_node: int, nodes: int | None, name: str | None,
            namespace: str | None, cluster_selector: str | None, queue: str | None, submission_mode: str,
            time_limit: str | None, ttl: int, keep_cluster: bool, backoff_limit: int, pvc: str, existing_pvc: bool,
            storage_class: str | None, pvc_size: str, worker_cpus: str, worker_memory: str, head_cpus: str,
            head_memory: str, schedule: str | None, time_zone: str | None, same_dir: bool, retry_failed: bool,
            output_dir: str | None, out: str | None) -> None:
    """Write the KubeRay RayJob of CAMPAIGN (or, with --schedule, a RayCronJob): a cluster sized from its largest
    placement (or --cluster-selector), the ledger on a PersistentVolumeClaim so that a deleted or failed job
    applied again resumes, Kueue's queue label, a deadline from the estimate. Apply it with kubectl."""
    from raysweep.campaign import load_campaign
    from raysweep.drive import jobs
    from raysweep.drive.endpoint import endpoints_of
    from raysweep.place import kuberay as kr
    from raysweep.place import sizing
    from raysweep.plan.estimate import estimate, format_duration
    from raysweep.plan.plan import build_plan

    for opt, value, least in (("--gpus-per-node", gpus_per_node, 0), ("--nodes", nodes, 1), ("--ttl", ttl, 0),
                              ("--backoff-limit", backoff_limit, 0)):
        if value is not None and value < least:
            raise UserError(f"{opt}: {value} is not accepted: a whole number, {least} or more")
    if image.strip() == "" or any(c.isspace() for c in image):
        raise UserError(f"--image: {image!r} is not an image reference (registry/name:tag)")
    if output_dir is not None and not (PurePosixPath(output_dir).is_absolute()
                                       and PurePosixPath(output_dir).is_relative_to(kr.SHARED)):
        raise UserError(f"--output-dir: {output_dir!r} is not accepted: an absolute path under {kr.SHARED} (the "
                        "claim), so that a job applied again finds its ledger")
    if same_dir and schedule is None:
        raise UserError("--same-dir: only with --schedule (a RayCronJob's runs)")
    secs = kr.parse_duration(time_limit) if time_limit is not None else None
    spec = load_campaign(campaign_file)
    if endpoints_of(spec):
        raise UserError("serve.url: the campaign measures endpoints that run already; there is no server to place on "
                        "a KubeRay cluster (run it with `raysweep run` where the endpoints are reachable)")
    plan = build_plan(spec)
    sized = sizing.size(plan, gpus_per_node)
    want, gpn, which, ray_labels, ray_resources = sized.nodes, sized.gpus, sized.which, sized.labels, sized.resources
    if nodes is not None and nodes < want:
        raise UserError(f"--nodes: {nodes} is not accepted: the largest placement, {which}, needs {want} worker pod(s)")
    est = estimate(plan)
    if secs is None:
        secs = kr.deadline_s(est.wall_s)
        deadline_from = (f"the estimate ({format_duration(est.wall_s)}, {est.basis}) x {kr.MARGIN}, + "
                         f"{kr.START_S / 60:.0f} min for the pods' start")
    else:
        deadline_from = f"--time {time_limit}"
    campaign_name = spec.campaign.name
    job_name = name or _dns_name(f"raysweep-{campaign_name}", kr.MAX_CRON_NAME if schedule else kr.MAX_NAME)
    with tempfile.TemporaryDirectory(prefix="rs-kuberay-") as tmp:
        staged = jobs.stage(spec, campaign_file, Path(tmp))
        files = kr.files_of(Path(tmp))
    pods = nodes or want
    job = kr.KubeJob(
        name=job_name, campaign=staged.campaign, files=files,
        output_dir=output_dir or f"{kr.SHARED}/results/{_dns_name(campaign_name, 200)}", image=image, nodes=pods,
        gpus_per_node=gpn, deadline_s=secs, namespace=namespace, worker_cpus=worker_cpus,
        worker_memory=worker_memory, head_cpus=head_cpus, head_memory=head_memory, pvc=pvc,
        make_pvc=not existing_pvc, storage_class=storage_class, pvc_size=pvc_size, cluster_selector=cluster_selector,
        queue=queue, submission_mode=submission_mode, shutdown=not keep_cluster, ttl_s=ttl,
        backoff_limit=backoff_limit, schedule=schedule, time_zone=time_zone, env_vars=staged.env_vars,
        retry_failed=retry_failed, dated=schedule is not None and not same_dir, ray_labels=ray_labels,
        ray_resources=ray_resources,
        why=[(f"cluster: RayCluster {cluster_selector} (running already)" if cluster_selector else
              f"workers: {pods} pod(s) x {gpn} GPU(s): the largest placement, {which}, on nodes of {gpus_per_node} "
              f"GPU(s)" + (f"; {pods - want} more for configurations at once" if pods > want else "")),
             f"activeDeadlineSeconds {secs}: {deadline_from}",
             f"plan: {len(plan.serves)} server configuration(s), {est.points} run(s), {est.server_starts} server "
             "start(s)",
             *([f"not sent (secrets; set them in the cluster): {', '.join(staged.secrets_kept)}"]
               * bool(staged.secrets_kept))])
    text = kr.render(job)          # every check of the options runs here, before anything is written
    if out == "-":
        click.echo(text, nl=False)
        return
    suffix = "raycronjob" if schedule else "rayjob"
    target = Path(out) if out is not None else Path(f"{Path(campaign_file).stem}.{suffix}.yaml")
    if target.is_dir():
        raise UserError(f"--out: {str(target)!r} is a directory; give a file name")
    from raysweep.record.files import write_text_atomic

    write_text_atomic(target, text)
    kind = "RayCronJob" if schedule else "RayJob"
    where = f"RayCluster {cluster_selector}" if cluster_selector else f"{pods} worker pod(s) x {gpn} GPU(s)"
    _say(f"wrote {target}: {kind} {job_name} on {where}, deadline {format_duration(secs)}"
         + (f", queue {queue}" if queue else "") + (f", schedule {schedule!r}" if schedule else "")
         + f"\napply: kubectl apply -f {target}   (again to resume; results in {job.output_dir} on the claim {pvc})")


def _dns_name(text: str, limit: int) -> str:
    """`text` as a DNS-1035 label: lower case, '-' for anything else, starting with a letter, at most `limit`."""
    s = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if not s or not s[0].isalpha():
        s = "rs-" + s
    return s[:limit].rstrip("-")
