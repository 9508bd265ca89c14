"""deploy/kubernetes: every manifest valid against the Kubernetes schema (offline, strict), and
the properties the recipes promise, read from the manifests themselves."""
import copy
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
VERSION = "1.33.0"      # backoffLimitPerIndex is GA from 1.33


def documents(name: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / name).read_text()) if doc]


def kind(name: str, wanted: str) -> dict:
    [doc] = [doc for doc in documents(name) if doc["kind"] == wanted]
    return doc


def flag(args: list[str], name: str) -> str:
    [value] = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    return value


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_is_valid_against_the_schema(path):
    docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, VERSION, strict=True)


def test_the_validator_refuses_what_the_api_server_would():
    job = kind("eval-job.yaml", "Job")
    typo = copy.deepcopy(job)
    typo["spec"]["backoffLimitPerIndx"] = 2
    wrong = copy.deepcopy(job)
    wrong["spec"]["completions"] = "sixteen"
    for bad in (typo, wrong):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, VERSION, strict=True)


def test_the_eval_job_is_indexed_one_gpu_a_shard_retried_per_index_then_merged():
    job = kind("eval-job.yaml", "Job")["spec"]
    pod = job["template"]["spec"]
    [container] = pod["containers"]
    assert job["completionMode"] == "Indexed" and job["backoffLimitPerIndex"] >= 1
    assert pod["restartPolicy"] == "Never"                      # what backoffLimitPerIndex requires
    assert 2 <= job["completions"] / job["parallelism"] <= 4
    assert {"name": "JEVANY_SHARD_COUNT", "value": str(job["completions"])} in container["env"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    command = container["args"][0]
    assert "--shard auto" in command and "--serve" in command and "${JOB_COMPLETION_INDEX}" in command
    [merge] = kind("eval-merge-job.yaml", "Job")["spec"]["template"]["spec"]["containers"]
    assert "jevany-eval merge" in merge["args"][0] and "/results/shard-*.jsonl" in merge["args"][0]


def test_the_serving_recipe_drains_on_the_way_out_and_is_found_by_dns():
    services = {s["metadata"]["name"]: s["spec"] for s in documents("serving.yaml") if s["kind"] == "Service"}
    assert services["jevany"]["clusterIP"] == "None"            # headless: one A record per ready pod
    assert services["jevany"]["ports"][0]["name"] == "zmq"      # and SRV records _zmq._tcp.jevany...
    assert services["jevany-http"]["ports"][0]["port"] == 8000
    sts = kind("serving.yaml", "StatefulSet")["spec"]
    pod = sts["template"]["spec"]
    [daemon] = pod["containers"]
    args = daemon["args"]
    assert sts["serviceName"] == "jevany" and daemon["resources"]["limits"]["nvidia.com/gpu"] == 1
    for probe in ("startupProbe", "readinessProbe"):
        assert daemon[probe]["httpGet"]["path"] == "/health"
    assert daemon["lifecycle"]["preStop"]["exec"]["command"][:2] == ["jevany-ctl", "drain"]
    assert pod["terminationGracePeriodSeconds"] > float(flag(args, "batch-timeout"))
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    mounts = {m["name"]: m["mountPath"] for m in daemon["volumeMounts"]}
    for name, option in (("curve", "curve-secret-key"), ("clients", "curve-allowed-clients"),
                         ("http-token", "http-token-file")):
        assert name in secrets and flag(args, option).startswith(mounts[name])
    assert kind("serving.yaml", "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    [metric] = kind("serving.yaml", "HorizontalPodAutoscaler")["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "jevany_queue_depth"


def test_the_daemon_takes_every_flag_the_recipe_gives_it():
    [daemon] = kind("serving.yaml", "StatefulSet")["spec"]["template"]["spec"]["containers"]
    shown = subprocess.run([sys.executable, "-m", "jevany_daemon", "serve", "--help"], capture_output=True,
                           text=True, env={"COLUMNS": "200", "PATH": ""}, timeout=60).stdout
    flags = [a.split("=", 1)[0] for a in daemon["args"] if a.startswith("--")]
    assert flags and [f for f in flags if f not in shown] == []


@pytest.mark.parametrize("name, wanted", [("serving.yaml", "StatefulSet"), ("eval-job.yaml", "Job")])
def test_a_gpu_pod_gives_triton_a_cache_directory_it_can_write(name, wanted):
    """Triton (fla's kernels for hybrid models) writes its cache under $HOME unless told otherwise; an
    image's user may have no writable home, and every kernel build would fail."""
    pod = kind(name, wanted)["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
    env = {e["name"]: e["value"] for e in container["env"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    path = Path(env["TRITON_CACHE_DIR"])
    [mount] = [m for at, m in mounts.items() if Path(at) in path.parents]
    assert not mount.get("readOnly") and "emptyDir" in volumes[mount["name"]]
