"""The process placement shipped for clusters, checked offline: the Kubernetes manifests against
the API's schemas (kubernetes-validate, no cluster), the environment they and the SLURM script
give each role loaded as a config, and the shapes the daemon and trainer need (one daemon; as
many trainer pods as torchrun nodes; as many servers as endpoints)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from spade_async.core.config import load_config

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "configs" / "k8s"
SBATCH = REPO / "configs" / "slurm" / "spade.sbatch"
MULTI = REPO / "configs" / "multi-node.toml"


def _docs() -> dict[tuple[str, str], dict]:
    out = {}
    for f in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc:
                out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def test_manifests_validate_against_the_kubernetes_schemas():
    docs = _docs()
    assert {k for k, _ in docs} >= {"PersistentVolumeClaim", "ConfigMap", "Service",
                                    "StatefulSet", "Job", "Deployment"}
    for doc in docs.values():
        kubernetes_validate.validate(doc, "1.30", strict=True)  # raises on any error
    bad = {**docs[("Deployment", "spade-daemon")], "spec": {"replicas": "one"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.30", strict=True)


def test_the_manifests_roles_fit_the_config_they_load():
    docs = _docs()
    env = dict(docs[("ConfigMap", "spade-env")]["data"])
    cfg = load_config(REPO / env.pop("SPADE_CONFIG"), environ=env)
    servers = docs[("StatefulSet", "spade-inference")]
    names = [f"spade-inference-{i}" for i in range(servers["spec"]["replicas"])]
    assert [e.name for e in cfg.endpoints] == names  # SPADE_ENDPOINT is the pod's name
    assert all(e.base_url == f"http://{n}.spade-inference:8000"
               for e, n in zip(cfg.endpoints, names, strict=True))
    assert str(cfg.paths.data_dir) == "/mnt/spade"
    daemon = docs[("Deployment", "spade-daemon")]["spec"]
    assert daemon["replicas"] == 1 and daemon["strategy"]["type"] == "Recreate"
    job = docs[("Job", "spade-trainer")]["spec"]
    command = " ".join(job["template"]["spec"]["containers"][0]["command"])
    assert job["completions"] == job["parallelism"] == 2 and "--nnodes 2" in command
    assert job["completionMode"] == "Indexed" and "$JOB_COMPLETION_INDEX" in command
    for kind, name in (("StatefulSet", "spade-inference"), ("Job", "spade-trainer"),
                       ("Deployment", "spade-daemon")):
        pod = docs[(kind, name)]["spec"]["template"]["spec"]
        claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                  if "persistentVolumeClaim" in v]
        assert claims == ["spade-data"], (kind, name)


def test_the_slurm_script_gives_each_role_a_loadable_config():
    assert subprocess.run(["bash", "-n", str(SBATCH)]).returncode == 0
    nodes = ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05", "gpu06", "cpu01"]
    out = subprocess.run(["bash", str(SBATCH), "--print-env", *nodes], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    roles: dict[str, dict[str, str]] = {}
    for line in out.splitlines():
        if line.startswith("## "):
            current = roles.setdefault(line[3:], {})
        else:
            key, _, value = line.partition("=")
            current[key] = value
    assert list(roles) == [*(f"inference {i}" for i in range(4)), "trainer 0", "trainer 1",
                           "daemon"]
    for role, env in roles.items():
        cfg = load_config(REPO / env["SPADE_CONFIG"], environ=env)
        assert [e.name for e in cfg.endpoints] == nodes[:4], role
        if role.startswith("inference"):
            assert env["SPADE_ENDPOINT"] == nodes[int(role.split()[1])]
        if role.startswith("trainer"):
            assert (f"--nnodes 2 --node-rank {role.split()[1]} --rdzv-backend c10d "
                    f"--rdzv-endpoint gpu05:29500") == env["SPADE_TORCHRUN_ARGS"]
    bad = subprocess.run(["bash", str(SBATCH), "--print-env", "only-one"], cwd=REPO,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "give 7 host names" in bad.stderr
