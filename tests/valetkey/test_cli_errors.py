"""What a new user meets on the command line: each error names its cause and the fix, in one line.

Against the session's real broker and Redis; an unreachable service is a free loopback port.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from tests.support.broker_stack import Broker
from valetkey.cli import main
from valetkey.dev.services import OpenBaoDev, RedisServer, free_port
from valetkey.dev.state import DevState, DirLock

UNSET = {"VALETKEY_BROKER_URL": None, "VALETKEY_REDIS_URL": None, "VALETKEY_DEV_DIR": None,
         "VAULT_ADDR": None}


@pytest.fixture(autouse=True)
def fresh_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No dev stack to find unless a test writes one (the CLI looks in ./.valetkey-dev)."""
    monkeypatch.chdir(tmp_path)


def cli(*args: str, token: str | None = "s.some-token", **env: str) -> Result:
    return CliRunner().invoke(main, list(args), env={**UNSET, "VAULT_TOKEN": token, **env})


def one_error_line(result: Result) -> str:
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


BROKER_COMMANDS = [
    pytest.param(["run", "create", "--grant", "slack:post_message"], id="run-create"),
    pytest.param(["run", "show", "run_x"], id="run-show"),
    pytest.param(["run", "end", "run_x"], id="run-end"),
    # revoke retries until recorded (docs/operations.md); --no-wait makes it fail at once
    pytest.param(["revoke", "--no-wait", "--run", "run_x"], id="revoke"),
    pytest.param(["revocations"], id="revocations"),
]


@pytest.mark.parametrize("args", BROKER_COMMANDS)
def test_unreachable_broker_is_one_line_naming_address_and_flag(args: list[str]) -> None:
    port = free_port()
    line = one_error_line(cli(*args, "--broker", f"http://127.0.0.1:{port}"))
    assert line.startswith(f"error: cannot reach the broker at http://127.0.0.1:{port} (from --broker or "
                    "VALETKEY_BROKER_URL): ConnectError; start it, or give its address with --broker URL "
                    "or VALETKEY_BROKER_URL")


def test_unreachable_broker_from_the_environment() -> None:
    port = free_port()
    line = one_error_line(cli("revocations", VALETKEY_BROKER_URL=f"http://127.0.0.1:{port}"))
    assert f"http://127.0.0.1:{port} (from --broker or VALETKEY_BROKER_URL)" in line


def _write_dev_state(directory: Path, broker_url: str, redis_url: str) -> None:
    directory.mkdir(exist_ok=True)
    DevState(os.getpid(), broker_url, redis_url, "http://127.0.0.1:1", str(directory)).write(directory)


def test_cli_finds_a_running_dev_stack_without_flags(broker: Broker, redis_server: RedisServer,
                                                     tmp_path: Path) -> None:
    with DirLock(tmp_path / ".valetkey-dev"):  # what a live `valetkey dev` holds
        _write_dev_state(tmp_path / ".valetkey-dev", broker.url, redis_server.url)
        shown = cli("revocations", "--json", token=broker.vault.admin_token)
        audit = cli("audit", "query", "--since", "1m", "--json")
    assert shown.exit_code == 0, shown.stderr
    assert isinstance(json.loads(shown.stdout), list)
    assert audit.exit_code == 0, audit.stderr


def test_a_dead_dev_stack_is_not_used(broker: Broker, tmp_path: Path) -> None:
    """A dev.json left behind (the stack was killed) with nobody holding the lock: ignored."""
    _write_dev_state(tmp_path / ".valetkey-dev", broker.url, "redis://127.0.0.1:1")
    line = one_error_line(cli("revocations", token=broker.vault.admin_token))
    assert "cannot reach the broker at http://127.0.0.1:8400 (the default)" in line


def test_no_token_says_which_one() -> None:
    line = one_error_line(cli("revocations", token=None))
    assert line.startswith("error: set VAULT_TOKEN to your Vault token: a runtime's for runs, the security "
                           "team's for revocations")


def test_unreachable_redis_names_address_and_flag() -> None:
    port = free_port()
    line = one_error_line(cli("audit", "query", "--redis", f"redis://127.0.0.1:{port}/0"))
    assert line.startswith(f"error: cannot read the audit stream at redis://127.0.0.1:{port}/0: ")
    assert line.endswith("give the right Redis with --redis URL or VALETKEY_REDIS_URL")


def test_no_redis_at_all_names_flag_and_variable() -> None:
    line = one_error_line(cli("audit", "tail"))
    assert "set --redis URL or VALETKEY_REDIS_URL" in line


def test_revoke_with_a_runtime_token_says_what_it_lacks(broker: Broker) -> None:
    line = one_error_line(cli("revoke", "--run", "run_x", "--broker", broker.url,
                              token=broker.vault.runtime_token("notifier")))
    assert line.startswith("error: 403 not_admin: this token identifies runtime 'notifier', not the security "
                           "team")


def test_run_create_with_the_admin_token_says_it_is_not_a_runtime(broker: Broker) -> None:
    line = one_error_line(cli("run", "create", "--grant", "slack:post_message", "--broker", broker.url,
                              token=broker.vault.admin_token))
    assert line.startswith("error: 403 unknown_caller: this token is the security team's (admin policy), "
                           "not a runtime's")


def test_revoking_a_run_that_never_existed_records_it_and_says_so(broker: Broker) -> None:
    result = cli("revoke", "--run", "run_neverexisted", "--reason", "typo?", "--broker", broker.url,
                 token=broker.vault.admin_token)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("revoked run run_neverexisted at ")
    assert result.stderr.startswith("warning: the broker has no run 'run_neverexisted' (never created, "
                                    "mistyped, or expired and purged); the revocation is recorded anyway")


def test_revoke_json_is_the_record_and_says_whether_the_run_was_known(broker: Broker) -> None:
    result = cli("revoke", "--run", "run_neverexisted2", "--json", "--broker", broker.url,
                 token=broker.vault.admin_token)
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert (record["scope"], record["name"], record["recorded"], record["unknown_run"]) == (
        "run", "run_neverexisted2", True, True)


def test_run_show_table_and_json(broker: Broker) -> None:
    token = broker.vault.runtime_token("notifier")
    run_id = broker.mint("notifier", [{"upstream": "slack", "purpose": "post_message"}]).json()["run_id"]
    table = cli("run", "show", run_id, "--broker", broker.url, token=token)
    assert table.exit_code == 0, table.stderr
    assert f"run      {run_id}" in table.stdout
    assert "state    active" in table.stdout
    assert "grant    slack:post_message" in table.stdout
    as_json = cli("run", "show", "--json", run_id, "--broker", broker.url, token=token)
    assert json.loads(as_json.stdout)["run_id"] == run_id


def test_policy_check_of_a_directory_without_documents_is_an_error(tmp_path: Path) -> None:
    line = one_error_line(cli("policy", "check", str(tmp_path)))
    assert line == (f"error: no policy documents in {tmp_path} (expected *.yaml files with kind: upstream, "
                    "kind: destination or kind: runtime)")


def test_unknown_policy_key_says_did_you_mean(tmp_path: Path) -> None:
    (tmp_path / "api.yaml").write_text(
        "version: 1\nkind: upstream\nname: api\nbase_url: https://api.example.com\n"
        "secret: {mount: secret, path: api, field: token}\ninject:\n  hedaer: Authorization\n"
        "env: {placeholder: API_TOKEN, base_url: API_URL}\n"
        "purposes:\n  read:\n    why: read\n    methods: [GET]\n    paths: [/items]\n")
    result = cli("policy", "check", str(tmp_path))
    assert result.exit_code == 1
    assert "unknown key 'hedaer' (fix: did you mean 'header'? allowed keys: [" in result.stderr


def test_dev_refuses_the_directory_of_a_live_stack(tmp_path: Path) -> None:
    with DirLock(tmp_path / "stack"):
        line = one_error_line(cli("dev", "--state-dir", str(tmp_path / "stack")))
    assert line == (f"error: a valetkey dev stack (pid {os.getpid()}) is already using {tmp_path / 'stack'}; "
                    "stop it, or give this one its own directory with --state-dir DIR (or VALETKEY_DEV_DIR)")


def test_version_and_short_help() -> None:
    assert cli("--version").stdout.startswith("valetkey ")
    assert cli("-h").stdout.startswith("Usage: ")
    assert cli("run", "create", "-h").stdout.startswith("Usage: ")


def _walk(command: click.Command, path: str = "valetkey") -> list[tuple[str, click.Command]]:
    found = [(path, command)]
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            found += _walk(sub, f"{path} {name}")
    return found


def test_every_command_and_option_has_help_and_no_empty_choice() -> None:
    missing, empty = [], []
    for path, command in _walk(main):
        if not command.help:
            missing.append(path)
        for param in command.params:
            if isinstance(param, click.Option) and not param.help:
                missing.append(f"{path} {param.opts[0]}")
            if isinstance(param.type, click.Choice) and "" in param.type.choices:
                empty.append(f"{path} {param.opts[0]}")
    assert (missing, empty) == ([], [])


@pytest.mark.parametrize("command", [
    pytest.param(["run", "show"], id="run-show"),
    pytest.param(["keys", "list"], id="keys-list"),
    pytest.param(["revocations"], id="revocations"),
    pytest.param(["revoke"], id="revoke"),
    pytest.param(["audit", "query"], id="audit-query"),
    pytest.param(["audit", "tail"], id="audit-tail"),
])
def test_machine_output_is_json_everywhere(command: list[str]) -> None:
    leaf = main
    for name in command:
        assert isinstance(leaf, click.Group)
        leaf = leaf.commands[name]
    assert any(isinstance(p, click.Option) and "--json" in p.opts for p in leaf.params)


def test_broker_refuses_to_start_with_a_token_vault_refuses(vault: OpenBaoDev, redis_server: RedisServer,
                                                            tmp_path: Path) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("VALETKEY_", "VAULT_"))},
           "VAULT_ADDR": vault.addr, "VAULT_TOKEN": "s.not-a-token", "VALETKEY_REDIS_URL": redis_server.url,
           "VALETKEY_LISTEN": f"127.0.0.1:{free_port()}"}
    ran = subprocess.run([sys.executable, "-m", "valetkey.cli", "broker", "serve"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 1
    assert ran.stderr == (f"error: Vault at {vault.addr} refused the broker's VAULT_TOKEN (403): give the "
                          "broker its own valid token (policy valetkey-broker); not starting, since every "
                          "caller would otherwise be told its own token is invalid\n")
    assert "s.not-a-token" not in ran.stdout + ran.stderr


def test_secret_put_writes_the_policy_path_from_stdin(vault: OpenBaoDev, tmp_path: Path) -> None:
    import hvac

    (tmp_path / "api.yaml").write_text(
        "version: 1\nkind: upstream\nname: api\nbase_url: https://api.example.com\n"
        "secret: {mount: secret, path: valetkey/tests/secret-put, field: token}\n"
        "inject: {header: Authorization, format: 'Bearer {secret}'}\n"
        "env: {placeholder: API_TOKEN, base_url: API_URL}\n"
        "purposes:\n  read:\n    why: read\n    methods: [GET]\n    paths: [/items]\n")
    result = CliRunner().invoke(main, ["secret", "put", "api", "--policy-dir", str(tmp_path)],
                                input="written-by-test\n",
                                env={**UNSET, "VAULT_ADDR": vault.addr, "VAULT_TOKEN": vault.root_token})
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ("wrote the secret of api to secret/valetkey/tests/secret-put (field token); "
                             "its gateway uses it at its next refresh (VALETKEY_SECRET_REFRESH)\n")
    assert "written-by-test" not in result.stdout + result.stderr
    read = hvac.Client(url=vault.addr, token=vault.root_token).secrets.kv.v2.read_secret_version(
        path="valetkey/tests/secret-put", mount_point="secret", raise_on_deleted_version=True)
    assert read["data"]["data"] == {"token": "written-by-test"}  # no trailing newline


def test_secret_put_for_an_unknown_upstream_lists_the_upstreams() -> None:
    from policies.load import SHIPPED_POLICY_DIR

    line = one_error_line(cli("secret", "put", "gitlab", "--policy-dir", str(SHIPPED_POLICY_DIR)))
    assert line == (f"error: no upstream 'gitlab' in {SHIPPED_POLICY_DIR}; upstreams: anthropic, github, "
                    "github-git, openai, slack")


def test_keys_with_vault_unreachable_names_vault_addr() -> None:
    port = free_port()
    line = one_error_line(cli("keys", "list", VAULT_ADDR=f"http://127.0.0.1:{port}"))
    assert line == (f"error: cannot read the key: cannot reach Vault at http://127.0.0.1:{port} "
                    "(ConnectionError); check VAULT_ADDR")
