"""`valetkey vault bootstrap` against a real OpenBao: what it creates and what each identity may do."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

import hvac.exceptions
import pytest
from click.testing import CliRunner

from contract.ca import CA_PATH, CA_PUBLIC_PATH, load_certs, material_from_kv
from contract.errors import BadRequest, Reason, Unauthenticated, Unavailable, ValetkeyError
from policies.model import Identity, PolicySet, Runtime
from valetkey.bootstrap import (
    HCL_DIR,
    Action,
    BootstrapReport,
    Layout,
    bootstrap,
    bootstrap_vault,
    open_client,
)
from valetkey.cli import main
from valetkey.dev.services import free_port
from valetkey.dev.vault_seed import DevVault

KEY = "valetkey-tokens"


def _token(bv: DevVault, who: str) -> str:
    kind, _, name = who.partition(":")
    if kind == "gateway":
        return bv.gateway_token(name)
    if kind == "runtime":
        return bv.runtime_token(name)
    if kind == "proxy":
        return bv.proxy_token()
    return {"broker": bv.broker_token, "admin": bv.admin_token, "root": bv.root_token}[kind]


def _read_secret(upstream: str) -> Callable[[Any, DevVault], Any]:
    def read(client: Any, bv: DevVault) -> Any:
        ref = bv.policies.upstreams[upstream].secret
        answer = client.secrets.kv.v2.read_secret_version(
            path=ref.path, mount_point=ref.mount, raise_on_deleted_version=True
        )
        return answer["data"]["data"][ref.field]

    return read


def _sign(client: Any, bv: DevVault) -> Any:
    data = base64.b64encode(b"header.claims").decode()
    return client.secrets.transit.sign_data(name=KEY, hash_input=data)["data"]["signature"]


def _read_key(client: Any, bv: DevVault) -> Any:
    return client.secrets.transit.read_key(name=KEY)["data"]["type"]


def _read_kv(path: str) -> Callable[[Any, DevVault], Any]:
    def read(client: Any, bv: DevVault) -> Any:
        return client.secrets.kv.v2.read_secret_version(
            path=path, mount_point="secret", raise_on_deleted_version=True)["data"]["data"]

    return read


def _lookup_runtime(client: Any, bv: DevVault) -> Any:
    return client.auth.token.lookup(token=bv.runtime_token("notifier"))["data"]["policies"]


def _list_policies(client: Any, bv: DevVault) -> Any:
    return client.sys.list_acl_policies()["data"]["keys"]


def _list_secrets(client: Any, bv: DevVault) -> Any:
    return client.secrets.kv.v2.list_secrets(path="valetkey/upstreams")["data"]["keys"]


OPERATIONS: dict[str, Callable[[Any, DevVault], Any]] = {
    "read-github": _read_secret("github"),
    "read-github-git": _read_secret("github-git"),
    "read-openai": _read_secret("openai"),
    "read-anthropic": _read_secret("anthropic"),
    "read-slack": _read_secret("slack"),
    "list-secrets": _list_secrets,
    "sign": _sign,
    "read-key": _read_key,
    "lookup-token": _lookup_runtime,
    "list-policies": _list_policies,
    "read-ca": _read_kv(CA_PATH),
    "read-ca-public": _read_kv(CA_PUBLIC_PATH),
}

ALLOWED = [
    pytest.param("gateway:github", "read-github", id="gateway-github-reads-github"),
    pytest.param("gateway:openai", "read-openai", id="gateway-openai-reads-openai"),
    pytest.param("broker", "sign", id="broker-signs"),
    pytest.param("broker", "read-key", id="broker-reads-public-key"),
    pytest.param("broker", "lookup-token", id="broker-looks-up-callers"),
    pytest.param("admin", "lookup-token", id="admin-looks-up-callers"),
    pytest.param("admin", "read-key", id="admin-reads-key-for-keys-list"),
    pytest.param("admin", "list-policies", id="admin-lists-policies"),
    *[pytest.param("proxy", f"read-{u}", id=f"proxy-reads-{u}")
      for u in ("github", "github-git", "openai", "anthropic", "slack")],
    pytest.param("proxy", "read-ca", id="proxy-reads-ca"),
    pytest.param("proxy", "read-ca-public", id="proxy-reads-ca-public"),
    pytest.param("broker", "read-ca-public", id="broker-reads-ca-public"),
    pytest.param("admin", "read-ca-public", id="admin-reads-ca-public"),
]

FORBIDDEN = [
    pytest.param("gateway:github", "read-openai", id="gateway-github-not-openai"),
    pytest.param("gateway:github", "read-github-git", id="gateway-github-not-github-git"),
    pytest.param("gateway:github", "list-secrets", id="gateway-github-not-list"),
    pytest.param("gateway:github", "sign", id="gateway-github-not-sign"),
    pytest.param("gateway:github", "read-key", id="gateway-github-not-read-key"),
    pytest.param("gateway:github", "lookup-token", id="gateway-github-not-lookup"),
    *[
        pytest.param("broker", op, id=f"broker-not-{op}")
        for op in ("read-github", "read-github-git", "read-openai", "read-anthropic",
                   "read-slack", "list-secrets", "list-policies")
    ],
    # run tokens are minted only by the broker, after its checks: the security team signs nothing
    pytest.param("admin", "sign", id="admin-not-sign"),
    pytest.param("admin", "read-github", id="admin-not-read-github"),
    pytest.param("admin", "list-secrets", id="admin-not-list-secrets"),
    pytest.param("runtime:notifier", "read-anthropic", id="notifier-not-read-secret"),
    pytest.param("runtime:notifier", "sign", id="notifier-not-sign"),
    pytest.param("runtime:notifier", "lookup-token", id="notifier-not-lookup"),
    pytest.param("runtime:coding-agent", "read-github", id="coding-agent-not-read-secret"),
    pytest.param("runtime:coding-agent", "sign", id="coding-agent-not-sign"),
    # the proxy reads the CA and the upstream secrets, nothing else
    *[pytest.param("proxy", op, id=f"proxy-not-{op}")
      for op in ("list-secrets", "sign", "read-key", "lookup-token", "list-policies")],
    pytest.param("broker", "read-ca", id="broker-not-read-ca-key"),
    pytest.param("admin", "read-ca", id="admin-not-read-ca-key"),
    pytest.param("gateway:github", "read-ca", id="gateway-not-read-ca"),
    pytest.param("gateway:github", "read-ca-public", id="gateway-not-read-ca-public"),
    pytest.param("runtime:coding-agent", "read-ca", id="coding-agent-not-read-ca"),
]


@pytest.mark.parametrize(("who", "operation"), ALLOWED)
def test_identity_may(bootstrapped_vault: DevVault, who: str, operation: str) -> None:
    with open_client(bootstrapped_vault.addr, _token(bootstrapped_vault, who)) as client:
        result = OPERATIONS[operation](client, bootstrapped_vault)
    if operation == "read-ca":
        assert material_from_kv(result).key_pem  # a usable CA: cert and key belong together
    elif operation == "read-ca-public":
        assert load_certs(result["certs"])
    elif operation.startswith("read-") and operation != "read-key":
        assert result == bootstrapped_vault.secrets[operation.removeprefix("read-")]
    else:
        assert result


@pytest.mark.parametrize(("who", "operation"), FORBIDDEN)
def test_identity_may_not(bootstrapped_vault: DevVault, who: str, operation: str) -> None:
    with (
        open_client(bootstrapped_vault.addr, _token(bootstrapped_vault, who)) as client,
        pytest.raises(hvac.exceptions.Forbidden),
    ):
        OPERATIONS[operation](client, bootstrapped_vault)


CAPABILITIES = [
    pytest.param("gateway:github", "secret/data/valetkey/upstreams/github", ["read"],
                 id="gateway-read-only"),
    pytest.param("gateway:github", "secret/metadata/valetkey/upstreams/github", ["deny"],
                 id="gateway-no-metadata"),
    pytest.param("broker", f"transit/keys/{KEY}/rotate", ["deny"], id="broker-no-rotate"),
    pytest.param("broker", f"transit/keys/{KEY}/config", ["deny"], id="broker-no-config"),
    pytest.param("broker", "auth/token/create/valetkey-run", ["update"], id="broker-run-tokens"),
    pytest.param("broker", "auth/token/create", ["deny"], id="broker-no-free-tokens"),
    pytest.param("broker", "auth/token/revoke-accessor", ["update"], id="broker-revokes"),
    pytest.param("broker", "secret/data/anything", ["deny"], id="broker-no-secrets"),
    pytest.param("admin", f"transit/sign/{KEY}", ["deny"], id="admin-no-sign"),
    pytest.param("admin", f"transit/sign/{KEY}/sha2-256", ["deny"], id="admin-no-sign-hash-path"),
    pytest.param("admin", "auth/token/create/valetkey-run", ["deny"], id="admin-no-run-tokens"),
    pytest.param("admin", "auth/token/create", ["deny"], id="admin-no-free-tokens"),
    pytest.param("admin", "auth/token/revoke-accessor", ["update"], id="admin-revokes-accessors"),
    pytest.param("admin", f"transit/keys/{KEY}", ["read"], id="admin-reads-key"),
    pytest.param("broker", f"transit/sign/{KEY}", ["update"], id="broker-signs"),
    pytest.param("admin", f"transit/keys/{KEY}/rotate", ["update"], id="admin-rotates"),
    pytest.param("admin", f"transit/keys/{KEY}/config", ["update"], id="admin-configures"),
    pytest.param("admin", "sys/policies/acl/valetkey-broker", ["read"], id="admin-reads-policy"),
    pytest.param("proxy", "secret/data/valetkey/proxy/ca", ["read"], id="proxy-reads-ca-only"),
    pytest.param("proxy", "secret/data/valetkey/upstreams/github", ["read"], id="proxy-reads-upstream"),
    pytest.param("proxy", "secret/data/valetkey/upstreams/other", ["deny"], id="proxy-no-other-secret"),
    pytest.param("proxy", "secret/data/valetkey/proxy/ca-other", ["deny"], id="proxy-no-ca-sibling"),
    pytest.param("proxy", "secret/metadata/valetkey/proxy/ca", ["deny"], id="proxy-no-ca-metadata"),
    pytest.param("proxy", "secret/data/anything", ["deny"], id="proxy-no-secrets"),
    pytest.param("proxy", "auth/token/create", ["deny"], id="proxy-no-tokens"),
    pytest.param("proxy", f"transit/sign/{KEY}", ["deny"], id="proxy-no-sign"),
    pytest.param("broker", "secret/data/valetkey/proxy/ca-public", ["read"], id="broker-reads-ca-public"),
    pytest.param("broker", "secret/data/valetkey/proxy/ca", ["deny"], id="broker-no-ca-key"),
    pytest.param("admin", "secret/data/valetkey/proxy/ca", ["create", "update"],
                 id="admin-writes-ca-without-reading"),
]


@pytest.mark.parametrize(("who", "path", "expected"), CAPABILITIES)
def test_capabilities(bootstrapped_vault: DevVault, who: str, path: str, expected: list[str]) -> None:
    """Mutating rights (rotate, config, create) are checked without using them."""
    with open_client(bootstrapped_vault.addr, _token(bootstrapped_vault, who)) as client:
        answer = client.adapter.post("/v1/sys/capabilities-self", json={"paths": [path]})
    assert sorted(answer["data"][path]) == expected


def test_first_run_created_everything(bootstrapped_vault: DevVault) -> None:
    created = {(s.kind, s.name) for s in bootstrapped_vault.report.with_action(Action.CREATED)}
    expected = {
        ("mount", "transit/ (transit)"),
        ("transit key", f"transit/keys/{KEY}"),
        ("auth", "approle/ (approle)"),
        ("policy", "valetkey-broker"),
        ("policy", "valetkey-admin"),
        ("policy", "valetkey-run"),
        ("policy", "valetkey-runtime"),
        ("policy", "valetkey-runtime-notifier"),
        ("approle role", "valetkey-broker"),
        ("policy", "valetkey-proxy"),
        ("approle role", "valetkey-proxy"),
        ("proxy CA", "secret/valetkey/proxy/ca"),
        ("proxy CA", "secret/valetkey/proxy/ca-public"),
        ("approle role", "valetkey-runtime-coding-agent"),
        ("token role", "valetkey-run"),
        *{("policy", f"valetkey-gateway-{u}") for u in bootstrapped_vault.policies.upstreams},
        *{("approle role", f"valetkey-gateway-{u}") for u in bootstrapped_vault.policies.upstreams},
    }
    assert created == expected
    # the dev server ships a KV v2 at secret/: bootstrap leaves it alone
    assert ("mount", "secret/ (kv v2)") in {
        (s.kind, s.name) for s in bootstrapped_vault.report.with_action(Action.PRESENT)
    }


def test_second_run_changes_nothing(bootstrapped_vault: DevVault) -> None:
    bv = bootstrapped_vault
    # other tests share this Vault and may have bootstrapped it with their own policies since:
    # the first run restores the shipped ones, the second must find everything in place
    bootstrap_vault(bv.addr, bv.root_token, bv.policies)
    again = bootstrap_vault(bv.addr, bv.root_token, bv.policies)
    assert not again.changed
    assert again.with_action(Action.CREATED) == []
    assert len(again.steps) == len(bv.report.steps)
    assert again.lines()[-1] == f"ok: 0 created, 0 updated, {len(again.steps)} present"


def test_transit_key_is_ed25519_and_not_exportable(bootstrapped_vault: DevVault) -> None:
    with open_client(bootstrapped_vault.addr, bootstrapped_vault.admin_token) as client:
        key = client.secrets.transit.read_key(name=KEY)["data"]
    assert key["type"] == "ed25519"
    assert key["exportable"] is False
    assert key["deletion_allowed"] is False


@pytest.mark.parametrize(
    ("runtime", "field", "expected"),
    [
        pytest.param("coding-agent", "meta", {"role_name": "valetkey-runtime-coding-agent"},
                     id="approle-meta-role-name"),
        pytest.param("coding-agent", "policies", ["default", "valetkey-runtime"],
                     id="approle-policies"),
        pytest.param("notifier", "policies", ["default", "valetkey-runtime-notifier"],
                     id="vault-policy"),
    ],
)
def test_broker_sees_runtime_identity(
    bootstrapped_vault: DevVault, runtime: str, field: str, expected: Any
) -> None:
    token = bootstrapped_vault.runtime_token(runtime)
    with open_client(bootstrapped_vault.addr, bootstrapped_vault.broker_token) as client:
        data = client.auth.token.lookup(token=token)["data"]
    value = data[field]
    assert (sorted(value) if isinstance(value, list) else value) == expected


def test_broker_creates_and_revokes_run_tokens(bootstrapped_vault: DevVault) -> None:
    with open_client(bootstrapped_vault.addr, bootstrapped_vault.broker_token) as client:
        made = client.auth.token.create(role_name="valetkey-run", ttl="10m")["auth"]
        data = client.auth.token.lookup(token=made["client_token"])["data"]
        assert data["policies"] == ["valetkey-run"]
        assert data["orphan"] is True
        assert data["renewable"] is False
        client.auth.token.revoke_accessor(made["accessor"])
        with pytest.raises(hvac.exceptions.Forbidden):
            client.auth.token.lookup(token=made["client_token"])


def _with_runtime(policies: PolicySet, identity: Identity) -> PolicySet:
    extra = Runtime(name="odd", identity=identity, allow=MappingProxyType({}), max_ttl=60,
                    max_grants=1, source="test.yaml")
    return PolicySet(upstreams=policies.upstreams,
                     runtimes=MappingProxyType({**policies.runtimes, "odd": extra}))


@pytest.mark.parametrize(
    "identity",
    [
        pytest.param(Identity(vault_policy="default"), id="policy-default"),
        pytest.param(Identity(vault_policy="root"), id="policy-root"),
        pytest.param(Identity(vault_policy="valetkey-broker"), id="policy-broker"),
        pytest.param(Identity(vault_policy="valetkey-gateway-github"), id="policy-gateway"),
        pytest.param(Identity(vault_policy="Upper-Case"), id="policy-upper-case"),
        pytest.param(Identity(approle_role="valetkey-broker"), id="role-broker"),
        pytest.param(Identity(approle_role="valetkey-gateway-x"), id="role-gateway"),
        pytest.param(Identity(approle_role="a/b"), id="role-slash"),
    ],
)
def test_refuses_identities_that_collide(bootstrapped_vault: DevVault, identity: Identity) -> None:
    bv = bootstrapped_vault
    with open_client(bv.addr, bv.root_token) as client:
        with pytest.raises(BadRequest) as info:
            bootstrap(client, _with_runtime(bv.policies, identity))
        assert "runtime odd identity" in info.value.detail
        assert not bootstrap(client, bv.policies).changed  # nothing was written


def test_policy_drift_is_repaired_but_a_runtime_policy_is_left_alone(
    bootstrapped_vault: DevVault,
) -> None:
    bv = bootstrapped_vault
    with open_client(bv.addr, bv.root_token) as client:
        original = client.sys.read_acl_policy(name="valetkey-runtime-notifier")["data"]["policy"]
        custom = original + '\npath "sys/health" {\n  capabilities = ["read"]\n}\n'
        client.sys.create_or_update_acl_policy(name="valetkey-runtime-notifier", policy=custom)
        client.sys.create_or_update_acl_policy(name="valetkey-broker", policy=custom)
        try:
            report = bootstrap(client, bv.policies)
            kept = client.sys.read_acl_policy(name="valetkey-runtime-notifier")["data"]["policy"]
        finally:
            client.sys.create_or_update_acl_policy(name="valetkey-runtime-notifier", policy=original)
    changed = [(s.kind, s.name, s.action) for s in report.steps if s.action is not Action.PRESENT]
    assert changed == [("policy", "valetkey-broker", Action.UPDATED)]
    assert kept == custom


def test_bootstrap_narrows_an_admin_policy_that_could_sign(bootstrapped_vault: DevVault) -> None:
    """Deployments bootstrapped before the admin lost ``transit/sign``: running bootstrap again
    takes the right away, and the admin's token is refused at once."""
    bv = bootstrapped_vault
    broad = f'path "transit/sign/{KEY}" {{\n  capabilities = ["update"]\n}}\n'
    with open_client(bv.addr, bv.root_token) as client:
        narrow = client.sys.read_acl_policy(name="valetkey-admin")["data"]["policy"]
        client.sys.create_or_update_acl_policy(name="valetkey-admin", policy=narrow + broad)
        with open_client(bv.addr, bv.admin_token) as admin:
            assert _sign(admin, bv)  # the old policy signed run tokens outside the broker
        report = bootstrap(client, bv.policies)
    changed = [(s.kind, s.name, s.action) for s in report.steps if s.action is not Action.PRESENT]
    assert changed == [("policy", "valetkey-admin", Action.UPDATED)]
    with open_client(bv.addr, bv.admin_token) as admin, pytest.raises(hvac.exceptions.Forbidden):
        _sign(admin, bv)
    with open_client(bv.addr, bv.broker_token) as broker:
        assert _sign(broker, bv)


@pytest.mark.parametrize(
    ("prepare", "layout", "fragment"),
    [
        pytest.param(lambda c: c.sys.enable_secrets_engine("kv", path="kv-one",
                                                           options={"version": "1"}),
                     Layout(kv_mount="kv-one"), "mount kv-one/ is kv v1", id="kv-v1-mount"),
        pytest.param(lambda c: c.sys.enable_secrets_engine("kv", path="not-transit",
                                                           options={"version": "2"}),
                     Layout(transit_mount="not-transit"), "mount not-transit/ is kv",
                     id="transit-mount-wrong-type"),
        pytest.param(lambda c: c.secrets.transit.create_key(name="rsa-key", key_type="rsa-2048"),
                     Layout(key_name="rsa-key"), "transit key transit/keys/rsa-key is rsa-2048",
                     id="key-wrong-type"),
    ],
)
def test_refuses_conflicting_state(
    bootstrapped_vault: DevVault, prepare: Callable[[Any], Any], layout: Layout, fragment: str
) -> None:
    with open_client(bootstrapped_vault.addr, bootstrapped_vault.root_token) as client:
        prepare(client)
        with pytest.raises(BadRequest) as info:
            bootstrap(client, bootstrapped_vault.policies, layout)
    assert fragment in info.value.detail


def _unreachable(bv: DevVault) -> tuple[str, str]:
    return f"http://127.0.0.1:{free_port()}", bv.root_token


def _bad_token(bv: DevVault) -> tuple[str, str]:
    return bv.addr, "not-a-real-token"


def _gateway_token(bv: DevVault) -> tuple[str, str]:
    return bv.addr, bv.gateway_token("github")


@pytest.mark.parametrize(
    ("target", "error", "reason", "fragment"),
    [
        pytest.param(_unreachable, Unavailable, Reason.VAULT_UNAVAILABLE, "Vault unreachable",
                     id="unreachable"),
        pytest.param(_bad_token, Unauthenticated, Reason.UNAUTHENTICATED, "refused the token",
                     id="bad-token"),
        pytest.param(_gateway_token, Unauthenticated, Reason.UNAUTHENTICATED,
                     "refused the token", id="token-without-rights"),
    ],
)
def test_vault_errors_are_translated(
    bootstrapped_vault: DevVault,
    target: Callable[[DevVault], tuple[str, str]],
    error: type[ValetkeyError],
    reason: Reason,
    fragment: str,
) -> None:
    addr, token = target(bootstrapped_vault)
    with pytest.raises(error) as info:
        bootstrap_vault(addr, token, bootstrapped_vault.policies)
    assert info.value.reason is reason
    assert fragment in info.value.detail
    assert token not in info.value.detail


@pytest.mark.parametrize(
    ("env", "code", "fragment"),
    [
        pytest.param({}, 0, "ok: 0 created, 0 updated", id="ok"),
        pytest.param({"VAULT_TOKEN": "not-a-real-token"}, 1, "refused the token", id="bad-token"),
        pytest.param({"VAULT_TOKEN": ""}, 2, "set VAULT_ADDR and VAULT_TOKEN", id="no-token"),
        pytest.param({"VALETKEY_POLICY_DIR": "/nonexistent"}, 1, "is not a directory",
                     id="bad-policy-dir"),
    ],
)
def test_cli(bootstrapped_vault: DevVault, env: dict[str, str], code: int, fragment: str) -> None:
    base = {"VAULT_ADDR": bootstrapped_vault.addr, "VAULT_TOKEN": bootstrapped_vault.root_token,
            "VALETKEY_POLICY_DIR": ""}
    result = CliRunner().invoke(main, ["vault", "bootstrap"], env={**base, **env})
    assert result.exit_code == code, result.output
    assert fragment in result.output
    assert bootstrapped_vault.root_token not in result.output


def test_report_lines_are_readable() -> None:
    report = BootstrapReport()
    report.add("policy", "valetkey-broker", Action.CREATED)
    report.add("mount", "secret/ (kv v2)", Action.PRESENT)
    assert report.lines() == [
        "created  policy        valetkey-broker",
        "present  mount         secret/ (kv v2)",
        "ok: 1 created, 0 updated, 1 present",
    ]


@pytest.mark.parametrize(
    ("broken", "fragment"),
    [
        pytest.param({"broker.hcl.tmpl": None}, "cannot read policy file", id="missing-file"),
        pytest.param({"gateway.hcl.tmpl": 'path "${nope}" {}\n'}, "bad placeholder",
                     id="unknown-placeholder"),
    ],
)
def test_bad_hcl_fails_before_any_write(
    bootstrapped_vault: DevVault, tmp_path: Path, broken: dict[str, str | None], fragment: str
) -> None:
    for source in HCL_DIR.iterdir():
        (tmp_path / source.name).write_text(source.read_text())
    for name, text in broken.items():
        target = tmp_path / name
        if text is None:
            target.unlink()
        else:
            target.write_text(text)
    bv = bootstrapped_vault
    with open_client(bv.addr, bv.root_token) as client:
        with pytest.raises(BadRequest) as info:
            bootstrap(client, bv.policies, Layout(run_role="another-run-role"), hcl_dir=tmp_path)
        assert fragment in info.value.detail
        with pytest.raises(hvac.exceptions.InvalidPath):
            client.adapter.get("/v1/auth/token/roles/another-run-role")


def test_proxy_ca_rotation_is_staged(bootstrapped_vault: DevVault) -> None:
    """A rotation stages the new CA in the other slot, trusted by bundles at once and signing only
    after the overlap; the next rotation alternates slots and never touches the signing one."""
    import json
    import time

    from contract.ca import CA_NEXT_PATH, fingerprint, signing_slot
    from valetkey.proxy_bootstrap import read_public, rotate_ca

    bv = bootstrapped_vault
    with open_client(bv.addr, bv.root_token) as client:
        before = load_certs(read_public(client))[0]
    now = time.time()
    with open_client(bv.addr, bv.admin_token) as admin:  # the security team rotates, reading no key
        rotation = rotate_ca(admin, overlap=3600, now=now)
        public_data = _read_kv(CA_PUBLIC_PATH)(admin, bv)
    public = load_certs(public_data["certs"])
    with open_client(bv.addr, bv.proxy_token()) as proxy:
        staged = material_from_kv(_read_kv(CA_NEXT_PATH)(proxy, bv))
        signing = material_from_kv(_read_kv(CA_PATH)(proxy, bv))

    assert rotation.slot == CA_NEXT_PATH
    assert rotation.public_certs == 2
    assert public[0] == before == load_certs(signing.cert_pem)[0]  # still signing, listed first
    assert public[1] == load_certs(staged.cert_pem)[0]  # trusted by bundles from now on
    assert signing_slot(public_data, now + 3599) == CA_PATH
    assert signing_slot(public_data, now + 3600) == CA_NEXT_PATH
    again = bootstrap_vault(bv.addr, bv.root_token, bv.policies)  # bootstrap keeps the staged CA
    assert {(s.name, s.action) for s in again.steps if s.kind == "proxy CA"} == {
        ("secret/valetkey/proxy/ca", Action.PRESENT), ("secret/valetkey/proxy/ca-public", Action.PRESENT)}
    with open_client(bv.addr, bv.admin_token) as admin:  # after the overlap: the next slot signs
        third = rotate_ca(admin, overlap=0, now=now + 7200)
        after = _read_kv(CA_PUBLIC_PATH)(admin, bv)
    slots = json.loads(after["slots"])
    assert third.slot == CA_PATH  # the retired slot is reused; the signing one (ca-next) stays
    assert slots[CA_NEXT_PATH]["sha256"] == fingerprint(public[1])
    assert next(fingerprint(c) for c in load_certs(after["certs"])) == fingerprint(public[1])


def test_bootstrap_repairs_a_lost_public_ca(bootstrapped_vault: DevVault) -> None:
    bv = bootstrapped_vault
    with open_client(bv.addr, bv.root_token) as client:
        client.secrets.kv.v2.delete_metadata_and_all_versions(path=CA_PUBLIC_PATH, mount_point="secret")
        report = bootstrap(client, bv.policies)
        ca = material_from_kv(_read_kv(CA_PATH)(client, bv))
        public = _read_kv(CA_PUBLIC_PATH)(client, bv)["certs"]

    assert ("secret/valetkey/proxy/ca-public", Action.CREATED) in {(s.name, s.action) for s in report.steps}
    assert public == ca.cert_pem


def test_proxy_policy_names_every_upstream_secret_and_the_ca() -> None:
    from policies.load import SHIPPED_POLICY_DIR, load_policy_dir
    from valetkey.bootstrap import _policy_documents

    policies = load_policy_dir(SHIPPED_POLICY_DIR)
    hcl = dict((n, h) for n, h, _ in _policy_documents(policies, Layout(), HCL_DIR))["valetkey-proxy"]
    paths = sorted(line.split('"')[1] for line in hcl.splitlines() if line.startswith("path "))

    assert paths == sorted({"secret/data/valetkey/proxy/ca", "secret/data/valetkey/proxy/ca-next",
                            "secret/data/valetkey/proxy/ca-public",
                            *(u.secret.api_path for u in policies.upstreams.values())})


def test_proxy_ca_cli_show_and_rotate(bootstrapped_vault: DevVault) -> None:
    bv = bootstrapped_vault
    env = {"VAULT_ADDR": bv.addr, "VAULT_TOKEN": bv.admin_token}
    runner = CliRunner()

    rotated = runner.invoke(main, ["proxy", "ca", "rotate"], env=env)
    shown = runner.invoke(main, ["proxy", "ca", "show", "--json"], env=env)
    pem = runner.invoke(main, ["proxy", "ca", "show", "--pem"], env=env)
    refused = runner.invoke(main, ["proxy", "ca", "rotate"], env={**env, "VAULT_TOKEN": bv.broker_token})

    assert rotated.exit_code == 0, rotated.output
    assert "2 certificate(s) in ca-public" in rotated.stdout
    assert [c["role"] for c in json.loads(shown.stdout)["certs"]] == ["current", "previous"]
    assert len(load_certs(pem.stdout)) == 2
    assert "PRIVATE" not in shown.stdout + pem.stdout + rotated.stdout
    assert refused.exit_code == 1
    assert "refused the token" in refused.stderr
