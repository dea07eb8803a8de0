"""The Kubernetes setup (S-TEAM-3), checked offline: no cluster runs here. The files of
deployments/kubernetes/ agree with each other and with the GPU lock (Secret names,
image tags, Ray and Prefect versions); the base job template declares every
placeholder it uses; the RayCluster is valid against KubeRay v1.7.0's CRD schema
(../shared/vendor, never committed) and the built-in kinds against Kubernetes' own
schemas (kubernetes-validate, from the dev extra, whose schemas are bundled). The
Prefect server's own check of the template is tests/services/test_kubernetes_pool.py;
the join script runs in tests/services/test_join_cluster.py."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT

K8S = REPO_ROOT / "deployments" / "kubernetes"
KUBERAY_VENDOR = REPO_ROOT.parent / "shared" / "vendor" / "kuberay-v1.7.0"
DOCS = REPO_ROOT / "docs" / "kubernetes.md"
IMAGE = "ghcr.io/ppo-flow/ppo-flow:0.1.0-gpu"
# name -> the key its users read; made with kubectl (docs/kubernetes.md), never a file here.
SECRETS = {"ppo-ray-token": "auth_token", "ppo-prefect-db": "connection-string", "ppo-prefect-auth": "auth-string"}
KUBERNETES_VERSION = "1.33.0"  # kubernetes-validate 1.37 bundles the schemas of Kubernetes 1.25 to 1.37


def _lock_version(package: str) -> str:
    line = next(line for line in (REPO_ROOT / "requirements-gpu.lock").read_text().splitlines()
                if line.startswith(f"{package}=="))
    return line.split("==", 1)[1].strip()


def _yaml(name: str):
    return yaml.safe_load((K8S / name).read_text())


def _compactor() -> dict:
    return _yaml("history-compactor.yaml")


def _template() -> dict:
    return json.loads((K8S / "base-job-template.json").read_text())


def _walk(value, path=()):
    """(path, value) of every leaf of a YAML/JSON document."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, (*path, index))
    else:
        yield path, value


def _secret_refs(document) -> set[tuple[str, str]]:
    """(Secret name, key) of every secretKeyRef in a document."""
    found = set()
    for path, value in _walk(document):
        if len(path) >= 2 and path[-2] == "secretKeyRef" and path[-1] == "name":
            parent = document
            for step in path[:-1]:
                parent = parent[step]
            found.add((value, parent.get("key")))
    return found


def test_every_placeholder_of_the_base_job_template_is_declared_and_every_variable_used():
    from prefect.utilities.templating import find_placeholders

    template = _template()
    used = {placeholder.name for placeholder in find_placeholders(json.dumps(template["job_configuration"]))}
    declared = set(template["variables"]["properties"])
    assert used - declared == set(), f"undeclared: {used - declared}"
    assert declared - used == set(), f"declared but never used: {declared - used}"


def test_the_job_runs_the_join_script_then_the_flow_and_is_never_retried_by_kubernetes():
    manifest = _template()["job_configuration"]["job_manifest"]
    assert manifest["spec"]["backoffLimit"] == 0  # an evicted pod fails the Job; Prefect reschedules the run
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "prefect-job"  # the container Prefect's worker fills in
    assert container["command"] == ["/opt/ppo-flow/deployments/kubernetes/join-ray-then.sh"]
    assert container["args"] == "{{ command }}"  # Prefect's own command, run by the join script
    env = {entry["name"]: entry for entry in container["env"]}
    assert env["RAY_ADDRESS"]["value"] == "{{ ray_address }}"
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "ppo-ray-token", "key": "auth_token"}
    address = _template()["variables"]["properties"]["ray_address"]["default"]
    assert address.startswith(f"{_yaml('raycluster.yaml')['metadata']['name']}-head-svc.")  # KubeRay's head service
    assert (K8S / "join-ray-then.sh").stat().st_mode & 0o111, "the join script must be executable"


def test_secret_names_and_keys_agree_across_files_and_the_docs_make_each_one():
    raycluster = _yaml("raycluster.yaml")
    assert raycluster["spec"]["authOptions"] == {"mode": "token", "secretName": "ppo-ray-token"}
    assert _secret_refs(_template()) == {("ppo-ray-token", "auth_token")}
    server = _yaml("helm/prefect-server-values.yaml")
    assert server["secret"] == {"create": False, "name": "ppo-prefect-db"}  # the chart reads `connection-string`
    assert server["postgresql"]["enabled"] is False and server["sqlite"]["enabled"] is False
    assert server["server"]["basicAuth"] == {"enabled": True, "existingSecret": "ppo-prefect-auth"}
    # S-FOOT-1: one env list (a second `env:` key silently replaced the first), and the
    # compactor reads the server's own Secrets and nothing else.
    env = {item["name"]: item["value"] for item in server["server"]["env"]}
    assert env["PREFECT_SERVER_EVENTS_RETENTION_PERIOD"] == "86400"
    assert env["PREFECT_SERVER_LOGS_STREAM_OUT_ENABLED"] == "true"
    assert _secret_refs(_compactor()) == {("ppo-prefect-db", "connection-string"), ("ppo-prefect-auth", "auth-string")}
    worker = _yaml("helm/prefect-worker-values.yaml")["worker"]
    assert worker["selfHostedServerApiConfig"]["basicAuth"] == {"enabled": True, "existingSecret": "ppo-prefect-auth"}
    creates = r"kubectl -n ppo create secret generic (\S+) \\\s*\n\s*--from-\w+=(\S+?)="
    made = dict(re.findall(creates, DOCS.read_text()))
    assert made == SECRETS, made


def test_no_password_or_token_is_written_in_any_file():
    texts = {path: path.read_text() for path in [*K8S.rglob("*"), DOCS] if path.is_file()}
    for path, text in texts.items():
        assert not re.search(r"postgresql(\+\w+)?://[^:\s/]+:(?!\$)[^@\s]+@", text), f"{path}: a password in a URL"
        assert not re.search(r"^\s*(password|authString|token):\s*\S", text, re.MULTILINE), f"{path}: a secret value"


def test_image_tags_and_versions_agree_with_the_gpu_lock():
    raycluster = _yaml("raycluster.yaml")
    assert raycluster["spec"]["rayVersion"] == _lock_version("ray")
    pods = [raycluster["spec"]["headGroupSpec"]["template"]] + [
        group["template"] for group in raycluster["spec"]["workerGroupSpecs"]
    ]
    images = {container["image"] for pod in pods for container in pod["spec"]["containers"]}
    images.add(_template()["variables"]["properties"]["image"]["default"])
    deployments = _yaml("prefect.yaml")["deployments"]
    images |= {deployment["work_pool"]["job_variables"]["image"] for deployment in deployments}
    images |= {container["image"] for container in _compactor()["spec"]["template"]["spec"]["containers"]}
    images |= set(re.findall(r"-t (\S+) \.", (K8S / "Dockerfile").read_text()))
    images |= set(re.findall(r"ghcr\.io/ppo-flow/ppo-flow:\S+?(?=[\s`]|$)", DOCS.read_text(), re.MULTILINE))
    assert images == {IMAGE}, images
    prefect = _lock_version("prefect")
    assert _yaml("prefect.yaml")["prefect-version"] == prefect
    assert {deployment["work_pool"]["name"] for deployment in deployments} == {"ppo-kubernetes"}
    assert _yaml("helm/prefect-worker-values.yaml")["worker"]["config"]["workPool"] == "ppo-kubernetes"
    assert _yaml("helm/prefect-server-values.yaml")["global"]["prefect"]["image"]["prefectTag"] == (
        f"{prefect}-python3.11"
    )
    assert _yaml("helm/prefect-worker-values.yaml")["worker"]["image"]["prefectTag"] == (
        f"{prefect}-python3.11-kubernetes"
    )


def test_the_head_takes_no_work_and_the_gpu_group_fits_the_public_4gpu_profile():
    from configs.loading import load_config

    spec = _yaml("raycluster.yaml")["spec"]
    assert spec["headGroupSpec"]["rayStartParams"] == {"num-cpus": "0", "num-gpus": "0"}
    config = load_config(str(REPO_ROOT / "configs" / "ppo_qwen06b_public_4gpu.py"))
    (group,) = spec["workerGroupSpecs"]
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert int(limits["nvidia.com/gpu"]) == config.grid.gpus_per_node  # one node, as the profile plans
    assert group["replicas"] == group["minReplicas"] == config.grid.num_nodes


def test_the_image_installs_the_gpu_lock_as_make_setup_gpu_does():
    makefile = (REPO_ROOT / "Makefile").read_text()
    dockerfile = (K8S / "Dockerfile").read_text()
    for flag in ("--no-deps -r", "--index-url", "--disable-pip-version-check"):
        assert flag in makefile and flag in dockerfile, flag
    unset = re.search(r"^GPU_PIP_ENV \?= (.*)$", makefile, re.MULTILINE).group(1)
    assert unset in dockerfile  # no pip configuration of the build host, as in make setup-gpu
    assert "requirements-gpu.lock" in dockerfile and "pip check" in dockerfile
    assert "COPY --chown=ray:ray . /opt/ppo-flow" in dockerfile  # the join script and the project


def _closed(schema):
    """The CRD's openAPIV3Schema as JSON Schema, the way KubeRay's CI converts it for
    kubeconform: int-or-string fields take either, and an object that lists its
    properties (and neither allows others nor preserves unknown fields) is closed, so a
    misspelt field is an error."""
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    schema = {key: _closed(value) for key, value in schema.items()}
    if schema.pop("x-kubernetes-int-or-string", False):
        schema.pop("type", None)
        schema.pop("anyOf", None)
        schema["oneOf"] = [{"type": "string"}, {"type": "integer"}]
    preserve = schema.pop("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in schema and "additionalProperties" not in schema and not preserve:
        schema["additionalProperties"] = False
    return schema


def test_the_raycluster_is_valid_against_the_kuberay_v1_7_0_crd_schema():
    if not KUBERAY_VENDOR.is_dir():
        pytest.skip(f"KubeRay v1.7.0's CRD schema is read from {KUBERAY_VENDOR}, absent in this clone")
    import jsonschema

    raycluster = _yaml("raycluster.yaml")
    fast_loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRD is 0.9 MB of YAML
    crd = yaml.load((KUBERAY_VENDOR / "ray.io_rayclusters.yaml").read_text(), Loader=fast_loader)  # noqa: S506
    (v1,) = [version for version in crd["spec"]["versions"] if version["name"] == raycluster["apiVersion"][7:]]
    closed = _closed(v1["schema"]["openAPIV3Schema"])
    closed["properties"]["metadata"] = {"type": "object"}
    converted = json.loads((KUBERAY_VENDOR / "raycluster.schema.json").read_text())
    for schema in (closed, converted):
        validator = jsonschema.Draft7Validator(schema)
        errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(raycluster)]
        assert errors == []
    broken = copy.deepcopy(raycluster)
    broken["spec"]["authOptions"]["secretname"] = broken["spec"]["authOptions"].pop("secretName")  # misspelt
    broken["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0  # KubeRay takes strings
    errors = {e.message for e in jsonschema.Draft7Validator(closed).iter_errors(broken)}
    assert any("'secretname' was unexpected" in message for message in errors), errors
    assert any("0 is not of type 'string'" in message for message in errors), errors


PREFECT_KUBERNETES = "prefect-kubernetes==0.7.11"  # the Kubernetes worker, for the GPU lock's Prefect
WORKER_RENDERS = r"""
import asyncio, json, sys, uuid
from prefect.client.schemas.objects import FlowRun
from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

template = json.load(open(sys.argv[1]))
async def render():
    configuration = await KubernetesWorkerJobConfiguration.from_template_and_values(template, json.loads(sys.argv[2]))
    configuration.prepare_for_flow_run(FlowRun(id=uuid.uuid4(), name="clever-otter", flow_id=uuid.uuid4()))
    print("JOB " + json.dumps(configuration.job_manifest))
asyncio.run(render())
"""


def _kubernetes_problems(document: dict) -> list[str]:
    """What Kubernetes' own schema (strict: no unknown fields) says of one object."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{document['kind']} {'/'.join(map(str, error.path))}: {error.message}"]
    return []


@pytest.fixture(scope="module")
def kubernetes_tools() -> Path:
    """A tools environment under .cache/ (made once; the project's own environment is
    left as it is): the GPU lock's Prefect with its Kubernetes worker, whose own job
    configuration renders the Job a flow run gets."""
    tools = REPO_ROOT / ".cache" / "k8s-tools"
    wanted = [f"prefect=={_lock_version('prefect')}", PREFECT_KUBERNETES]
    stamp = tools / ".installed"
    if not stamp.exists() or stamp.read_text().split() != wanted:
        if not (tools / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(tools)], check=True, timeout=300)
        installed = subprocess.run(
            [str(tools / "bin" / "python"), "-m", "pip", "install", "--quiet", *wanted],
            capture_output=True, text=True, timeout=900,
        )
        assert installed.returncode == 0, f"could not install {wanted}: {installed.stderr[-2000:]}"
        stamp.write_text(" ".join(wanted))
    return tools / "bin"


def _rendered_job() -> dict:
    """The Job the worker would submit: the template's manifest with its defaults
    applied (Prefect's own templating) and the values the worker fills in."""
    from prefect.utilities.templating import apply_values

    template = _template()
    values = {name: spec["default"] for name, spec in template["variables"]["properties"].items() if "default" in spec}
    values.update(name="ppo-public-4gpu", labels={"prefect.io/flow-run-name": "clever-otter"},
                  command="prefect flow-run execute", env={})
    job = apply_values(template["job_configuration"]["job_manifest"], values, remove_notset=True)
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["args"] = container["args"].split()  # as the worker does (shlex)
    # Prefect's worker requires these two in the pod spec (its base manifest has them there);
    # Kubernetes ignores them: strict validation would name them and nothing else.
    pod = job["spec"]["template"]["spec"]
    assert pod.pop("parallelism") == 1 and pod.pop("completions") == 1
    job["metadata"]["name"] = job["metadata"]["generateName"] + "abcde"  # as the API server names it
    return job


def test_the_built_in_kinds_are_valid_against_kubernetes_schemas():
    job = _rendered_job()
    storage = [document for document in yaml.safe_load_all((K8S / "shared-storage.yaml").read_text()) if document]
    assert job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == (
        storage[0]["metadata"]["name"]
    )
    documents = [*storage, job, _compactor()]
    assert [problem for document in documents for problem in _kubernetes_problems(document)] == []
    broken = copy.deepcopy(job)
    broken["spec"]["template"]["spec"]["containers"][0]["envv"] = []  # misspelt
    (problem,) = _kubernetes_problems(broken)
    assert problem == (
        "Job spec/template/spec/containers/0: Additional properties are not allowed ('envv' was unexpected)"
    )


# Through the tools environment (the GPU lock's Prefect and its Kubernetes worker), so
# -m slow: making it costs about 45 s and the package index once per checkout.


def test_the_kubernetes_deployments_parse_and_match_the_local_ones_but_for_the_pool_and_paths():
    """S-TEAM-3: the same flow, profiles and parameters as deployments/prefect.yaml;
    only the pool, the image and the shared paths differ."""
    from prefect.cli.deploy._models import DeploymentConfig

    local_file = yaml.safe_load((REPO_ROOT / "deployments" / "prefect.yaml").read_text())
    local = {deployment["name"]: deployment for deployment in local_file["deployments"]}
    for deployment in _yaml("prefect.yaml")["deployments"]:
        DeploymentConfig.model_validate(deployment)  # Prefect's own schema of a deployment entry
        twin = local[deployment["name"]]
        assert deployment["entrypoint"] == twin["entrypoint"]
        assert set(deployment["parameters"]) == set(twin["parameters"])
        assert deployment["parameters"]["profile"] == twin["parameters"]["profile"]
        assert "job.output_root=/shared/outputs" in deployment["parameters"]["overrides"]
        assert deployment.get("concurrency_limit") == twin.get("concurrency_limit")


@pytest.mark.slow
def test_the_kubernetes_worker_renders_a_valid_job_that_joins_then_runs_the_flow(kubernetes_tools, tmp_path):
    """The Job a flow run of ppo/public-4gpu gets, as Prefect's own Kubernetes worker
    (the GPU lock's Prefect) renders it from the template and the deployment's job
    variables: accepted by the worker's validation, valid for Kubernetes, the join
    script running Prefect's flow-run command with the run's environment added."""
    (deployment,) = [d for d in _yaml("prefect.yaml")["deployments"] if d["name"] == "public-4gpu"]
    env = {"PREFECT_HOME": str(tmp_path), "PREFECT_API_URL": "http://127.0.0.1:9/api", "PATH": "/usr/bin:/bin"}
    rendered = subprocess.run(
        [str(kubernetes_tools / "python"), "-c", WORKER_RENDERS, str(K8S / "base-job-template.json"),
         json.dumps(deployment["work_pool"]["job_variables"])],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert rendered.returncode == 0 and "JOB " in rendered.stdout, rendered.stderr[-3000:]
    job = json.loads(rendered.stdout.split("JOB ", 1)[1])
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["/opt/ppo-flow/deployments/kubernetes/join-ray-then.sh"]
    assert container["args"] == ["prefect", "flow-run", "execute"]
    names = [entry["name"] for entry in container["env"]]
    assert "PREFECT__FLOW_RUN_ID" in names and "RAY_ADDRESS" in names and "RAY_AUTH_TOKEN" in names
    assert container["image"] == IMAGE and job["spec"]["backoffLimit"] == 0
    pod = job["spec"]["template"]["spec"]
    assert pod.pop("parallelism") == 1 and pod.pop("completions") == 1  # Prefect's; Kubernetes ignores them
    job["metadata"]["name"] = job["metadata"]["generateName"] + "abcde"
    assert _kubernetes_problems(job) == []
