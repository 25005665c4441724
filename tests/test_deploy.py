"""The deploy examples stay parseable, and their policy ConfigMap matches the shipped policies."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
YAML_FILES = sorted(p for p in DEPLOY.rglob("*.yaml"))


@pytest.mark.parametrize("path", YAML_FILES, ids=[str(p.relative_to(DEPLOY)) for p in YAML_FILES])
def test_deploy_yaml_parses(path: Path) -> None:
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert documents


def test_there_are_deploy_examples() -> None:
    assert (DEPLOY / "compose.yaml").is_file()
    assert (DEPLOY / "k8s").is_dir()
    assert {p.stem for p in (DEPLOY.parent / "valetkey" / "hcl").glob("*.hcl*")} >= {"gateway.hcl", "runtime"}
