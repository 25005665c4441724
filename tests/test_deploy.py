"""The deploy examples stay parseable, and their policy ConfigMap matches the shipped policies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
YAML_FILES = sorted(p for p in DEPLOY.rglob("*.yaml"))
K8S_VERSION = "1.33.0"  # the oldest Kubernetes these manifests are meant for
K8S_DOCUMENTS = [
    pytest.param(doc, id=f"{path.name}:{doc['kind']}:{doc['metadata']['name']}")
    for path in sorted((DEPLOY / "k8s").glob("*.yaml"))
    for doc in yaml.safe_load_all(path.read_text())
    if doc is not None and doc.get("kind") != "Kustomization"
]


@pytest.mark.parametrize("path", YAML_FILES, ids=[str(p.relative_to(DEPLOY)) for p in YAML_FILES])
def test_deploy_yaml_parses(path: Path) -> None:
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert documents


def test_there_are_deploy_examples() -> None:
    assert (DEPLOY / "compose.yaml").is_file()
    assert (DEPLOY / "k8s").is_dir()
    assert {p.stem for p in (DEPLOY.parent / "valetkey" / "hcl").glob("*.hcl*")} >= {"gateway.hcl", "runtime"}


@pytest.mark.parametrize("document", K8S_DOCUMENTS)
def test_k8s_manifest_matches_the_kubernetes_schema(document: dict[str, Any]) -> None:
    """Strict: an unknown or misplaced field is an error, as ``kubectl apply`` would say."""
    kubernetes_validate.validate(document, K8S_VERSION, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    listed = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())["resources"]
    present = {p.name for p in (DEPLOY / "k8s").glob("*.yaml")} - {"kustomization.yaml"}
    assert set(listed) <= present
    assert present - set(listed) == {"redis.yaml"}  # the single-node alternative to redis-sentinel.yaml


def test_ha_topology_speaks_the_urls_valetkey_takes() -> None:
    from contract.env import redis_url_setting, url_list_setting

    compose = yaml.safe_load((DEPLOY / "compose-ha.yaml").read_text())
    env = compose["x-ha-env"]
    url = env["VALETKEY_REDIS_URL"].replace("${VALETKEY_REDIS_PASSWORD:?write VALETKEY_REDIS_PASSWORD into "
                                            "deploy/.env}", "pw")
    assert redis_url_setting({"U": url}, "U", "").startswith("redis+sentinel://")
    assert len(url_list_setting({"V": env["VAULT_ADDR"]}, "V", "").split(",")) == 3
    secret = next(d for d in yaml.safe_load_all((DEPLOY / "k8s" / "secrets.yaml").read_text())
                  if d["metadata"]["name"] == "valetkey-redis")
    assert redis_url_setting({"U": secret["stringData"]["url"]}, "U", "").startswith("redis+sentinel://")
