"""Offline checks of the deployment files: the compose file and the Kubernetes manifests parse as
YAML and hang together (probes on the real paths and port, a grace period that covers the drain,
the HPA and PDB aimed at the Deployment, the Service selecting its pods, a metric that exists)."""

import re
from pathlib import Path

import yaml

from gateway.app import create_app
from gateway.config import Config
from gateway.ice import parse_port_range
from gateway.metrics import Metrics

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"


def manifests() -> dict[str, dict]:
    """{kind: document} of the gateway's base manifests; other components' as {kind/name: document}."""
    docs = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert isinstance(doc, dict) and doc.get("kind"), f"{path.name}: not a Kubernetes object"
            component = doc.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/component")
            key = doc["kind"] if component in (None, "gateway") else f"{doc['kind']}/{doc['metadata']['name']}"
            assert key not in docs, f"two {key} objects"
            docs[key] = doc
    return docs


def env_of(container: dict) -> dict[str, dict]:
    return {item["name"]: item for item in container["env"]}


def known_routes() -> set[str]:
    app = create_app(Config())
    return {resource.canonical for resource in app.router.resources()}


def test_base_has_every_object_and_kustomization_lists_them():
    docs = manifests()
    assert {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "Kustomization"} <= docs.keys()
    listed = set(docs["Kustomization"]["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


def test_deployment_probes_grace_and_security():
    deployment = manifests()["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = env_of(container)
    assert int(env["PARLEY_PORT"]["value"]) == port_names["http"]
    routes = known_routes()
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/livez")):
        get = container[probe]["httpGet"]
        assert get["path"] == path and get["path"] in routes
        assert get["port"] in port_names or get["port"] in port_names.values()
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    pre_stop_s = float(pre_stop[1]) if pre_stop[0] == "sleep" else 0.0
    drain_s = float(env["PARLEY_DRAIN_TIMEOUT_S"]["value"])
    assert pod["terminationGracePeriodSeconds"] > pre_stop_s + drain_s
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert env["PARLEY_SECRET"]["valueFrom"]["secretKeyRef"]["name"]
    assert env["PARLEY_ICE_ADDRESSES"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    # every PARLEY_* variable is a real setting
    settings = {"PARLEY_" + name.upper() for name in Config.__dataclass_fields__}
    parley_env = {name for name in env if name.startswith("PARLEY_")}
    assert parley_env <= settings, parley_env - settings


def test_redis_is_deployed_where_the_gateways_look_for_it():
    docs = manifests()
    service = docs["Service/parley-redis"]
    assert service["spec"]["selector"] == docs["Deployment/parley-redis"]["spec"]["template"]["metadata"]["labels"]
    (container,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    url = env_of(container)["PARLEY_REDIS_URL"]["value"]
    assert url == f"redis://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}/0"
    parse_port_range(env_of(container)["PARLEY_MEDIA_PORTS"]["value"])
    assert "redis.yaml" in yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]


def test_service_pdb_and_hpa_point_at_the_deployment():
    docs = manifests()
    deployment = docs["Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = docs["Service"]
    assert service["spec"]["selector"].items() <= labels.items()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= {p["name"] for p in container["ports"]}
    assert docs["PodDisruptionBudget"]["apiVersion"] == "policy/v1"
    assert docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = docs["HorizontalPodAutoscaler"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": deployment["metadata"]["name"]}
    assert 2 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    name = metric["pods"]["metric"]["name"]
    assert re.search(rf"^{name} ", Metrics().exposition().decode(), re.M), f"{name} is not exported"
    max_sessions = int(env_of(container)["PARLEY_MAX_SESSIONS"]["value"])
    assert 0 < float(metric["pods"]["target"]["averageValue"]) <= max_sessions


def test_cuda_overlay_requests_a_gpu():
    overlay = yaml.safe_load((K8S / "cuda" / "kustomization.yaml").read_text())
    assert "../" in overlay["resources"] or ".." in overlay["resources"]
    (patch,) = overlay["patches"]
    assert patch["target"] == {"kind": "Deployment", "name": manifests()["Deployment"]["metadata"]["name"]}
    gpu = yaml.safe_load((K8S / "cuda" / patch["path"]).read_text())
    (container,) = gpu["spec"]["template"]["spec"]["containers"]
    base = manifests()["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["name"] == base["name"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert overlay["images"][0]["newTag"] == "cuda"


def test_compose_has_redis_and_two_gateways():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert "redis" in services
    gateways = {name: s for name, s in services.items() if name.startswith("gateway")}
    assert len(gateways) >= 2
    ports, media_ranges = set(), []
    settings = {"PARLEY_" + name.upper() for name in Config.__dataclass_fields__}
    for name, service in gateways.items():
        env = service["environment"]
        assert set(env) <= settings, f"{name}: unknown settings {set(env) - settings}"
        ports.add(env["PARLEY_PORT"])
        assert "redis" in service["depends_on"]
        assert service["network_mode"] == "host"  # media reaches the replica directly
        grace = float(service["stop_grace_period"].rstrip("s"))
        drain = float(re.search(r"(\d+)", str(env["PARLEY_DRAIN_TIMEOUT_S"]).split(":-")[-1]).group(1))
        assert grace > drain
        assert env["PARLEY_SECRET"].startswith("${PARLEY_SECRET")  # shared, never a literal
        assert env["PARLEY_REDIS_URL"].startswith("redis://")  # sessions shared between replicas
        assert env["PARLEY_PUBLIC_URL"].endswith(":" + env["PARLEY_PORT"])  # drain redirects land here
        media_ranges.append(parse_port_range(env["PARLEY_MEDIA_PORTS"]))
    assert len(ports) == len(gateways), "each replica needs its own HTTP port on the host"
    media_ranges.sort()
    assert all(a[1] < b[0] for a, b in zip(media_ranges, media_ranges[1:])), "media port ranges overlap"


def test_dockerfile_is_non_root_with_a_cuda_build_arg():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11", dockerfile, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}", dockerfile, re.M)
    assert re.search(r"^ARG TORCH_INDEX_URL=.*/cpu$", dockerfile, re.M)
    assert re.search(r"^COPY engine engine$", dockerfile, re.M)  # weights baked in
    users = re.findall(r"^USER (\S+)", dockerfile, re.M)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r'^CMD \["parley", "serve"\]', dockerfile, re.M)
