"""`valetkey policy check DIR`: exit 0 with a summary, or exit 1 listing file, rule and fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from valetkey.cli import main

REPO = Path(__file__).resolve().parents[2]
BROKEN = "tests/fixtures/policies/broken"
VALETKEY = Path(sys.executable).parent / "valetkey"


@pytest.fixture
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from the repository root so the command takes the same relative paths as CI does."""
    monkeypatch.chdir(REPO)


def check(directory: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["policy", "check", directory])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.usefixtures("in_repo")
def test_shipped_policies_pass() -> None:
    code, out, err = check("policies")

    assert (code, err) == (0, "")
    assert out.splitlines()[-1] == "ok: 5 upstream(s), 4 destination(s), 2 runtime(s)"
    assert "upstream github: https://api.github.com purposes=" in out
    assert "destination pypi: pypi.org ports=[443] tls=tunnel purposes=['connect']" in out
    assert "destination python-docs: docs.python.org ports=[443] tls=terminate purposes=['read']" in out
    assert "runtime notifier: max_ttl=1800s" in out


@pytest.mark.usefixtures("in_repo")
def test_valid_fixtures_pass_and_flag_allow_private() -> None:
    code, out, _ = check("tests/fixtures/policies/valid")

    assert code == 0
    assert "upstream weather: http://weather.example.com:8080 purposes=['current']" in out
    assert "allow_private: true" in out
    assert out.splitlines()[-1] == "ok: 2 upstream(s), 0 destination(s), 1 runtime(s)"


@pytest.mark.usefixtures("in_repo")
@pytest.mark.parametrize(
    ("dirname", "line"),
    [
        pytest.param(
            "base-url-ftp",
            "upstream demo base_url: scheme 'ftp' is not http or https "
            "(fix: write an origin such as https://api.example.com "
            "(path prefixes go in env.base_path))",
            id="base-url-ftp",
        ),
        pytest.param(
            "runtime-unknown-purpose",
            "runtime demo-agent allow demo: unknown purpose 'write_item' "
            "(fix: use one of ['read_item'])",
            id="runtime-unknown-purpose",
        ),
        pytest.param(
            "duplicate-yaml-key",
            "yaml: line 4, column 1: duplicate key 'name' (fix: fix the YAML syntax)",
            id="duplicate-yaml-key",
        ),
        pytest.param(
            "path-template-catch-all",
            "upstream demo purpose read_item paths[0]: path template '/{path}' matches every "
            "path; give it at least one literal segment "
            "(fix: name a concrete path with {param} segments)",
            id="path-template-catch-all",
        ),
    ],
)
def test_broken_fixture_fails_with_file_rule_and_fix(dirname: str, line: str) -> None:
    code, out, err = check(f"{BROKEN}/{dirname}")

    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"error: {BROKEN}/{dirname}/broken.yaml: {line}",
        f"1 problem(s) in {BROKEN}/{dirname}",
    ]


def test_missing_directory_fails(tmp_path: Path) -> None:
    code, _, err = check(str(tmp_path / "nope"))

    assert code == 1
    assert f"error: {tmp_path / 'nope'}: policy dir: is not a directory" in err


def run_console_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VALETKEY), *args], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )


def test_console_script_passes_shipped_policies() -> None:
    result = run_console_script("policy", "check", "policies")

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "ok: 5 upstream(s), 4 destination(s), 2 runtime(s)"


def test_console_script_fails_on_broken_fixture() -> None:
    result = run_console_script("policy", "check", f"{BROKEN}/why-multiline")

    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.splitlines() == [
        f"error: {BROKEN}/why-multiline/broken.yaml: upstream demo purpose read_item why: "
        "needs a one-line reason (fix: write one sentence saying why it exists)",
        f"1 problem(s) in {BROKEN}/why-multiline",
    ]
