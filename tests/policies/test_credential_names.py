"""Credential-named fields: which names count, in every spelling, and which ordinary names never do."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.credential_names import (
    COMPOUND_SUFFIXES,
    FLAT_NAMES,
    NAMES,
    NOT_CREDENTIALS,
    WORD_SUFFIXES,
    is_credential_name,
    normalised,
    words,
)

CREDENTIAL = [
    *(pytest.param(n, id=n) for n in (
        "api_key", "apikey", "API-Key", "apiKey", "x-api-key", "X-API-KEY", "XAPIKey", "access_token",
        "accessToken", "token", "TOKEN", "auth", "password", "Password", "secret", "client_secret",
        "clientSecret", "private_token", "PRIVATE-TOKEN", "refresh_token", "id_token", "session",
        "sessionid", "PHPSESSID", "jsessionid", "githubToken", "openai_api_key", "OPENAI_API_KEY",
        "openaiapikey", "db_password", "newPassword", "user[password]", "credentials[api_key]",
        "auth.token", "token2", "api_key_1", "x-amz-security-token", "X-Amz-Credential", "passwd",
        "pwd", "passphrase", "bearer", "authorization", "slack_webhook_secret", "csrf_token",
        "private_key", "secretKey", "client_assertion", "x_service_token",
    )),
]
NOT_CREDENTIAL = [
    *(pytest.param(n, id=n) for n in (
        "max_tokens", "max_completion_tokens", "maxTokens", "tokens", "budget_tokens", "input_tokens",
        "token_type", "tokenizer", "token_count", "prompt_cache_key", "idempotency_key",
        "Idempotency-Key", "sort_key", "keys", "secret_name", "secrets", "password_hash", "author",
        "authors", "oauth", "nextPageToken", "page_token", "continuation_token", "eos_token",
        "pad_token", "session_count", "sessions", "passage", "keyboard", "monkey", "tok", "",
        "---", "__", "123", "model", "messages", "title", "body", "labels", "thread_ts",
        "channel", "stream", "temperature", "Sec-WebSocket-Key", "api_key_id", "token_expires_in",
        "signature", "key", "sig",
    )),
]


@pytest.mark.parametrize("name", CREDENTIAL)
def test_credential_names(name: str) -> None:
    assert is_credential_name(name)
    assert is_credential_name(name, flat=True)


@pytest.mark.parametrize("name", NOT_CREDENTIAL)
def test_ordinary_names(name: str) -> None:
    assert not is_credential_name(name)


@pytest.mark.parametrize(
    ("name", "flat"),
    [pytest.param(n, f, id=f"{n}-{'flat' if f else 'json'}") for n in ("key", "KEY", "sig", "signature")
     for f in (True, False)],
)
def test_flat_only_names(name: str, flat: bool) -> None:
    """``?key=`` is an API key; ``{"key": …, "value": …}`` and a thinking block's signature are data."""
    assert is_credential_name(name, flat=flat) is flat


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("openAI_API-Key", ("open", "ai", "api", "key"), id="mixed"),
        pytest.param("XAPIKey", ("xapi", "key"), id="acronym-then-word"),
        pytest.param("user[password]", ("user", "password"), id="brackets"),
        pytest.param("token_2", ("token",), id="trailing-number"),
        pytest.param("\uff41\uff50\uff49_key", ("key",), id="full-width-is-no-ascii"),
    ],
)
def test_words(name: str, expected: tuple[str, ...]) -> None:
    assert words(name) == expected


def test_rule_data_is_consistent() -> None:
    every = NAMES | FLAT_NAMES | set(COMPOUND_SUFFIXES) | WORD_SUFFIXES | NOT_CREDENTIALS
    assert all(r == normalised(r) for r in every), "rules are written normalised"
    assert not NOT_CREDENTIALS & NAMES
    assert all(not is_credential_name(n, flat=True) for n in NOT_CREDENTIALS)


def test_a_huge_name_is_judged_by_its_start() -> None:
    assert is_credential_name("api_key" + "x" * 10_000) is False  # the words run on: no suffix
    assert is_credential_name("x" * 10_000 + "_token") is False  # past MAX_NAME
    assert is_credential_name("a_" * 100 + "token") is True


VOCABULARY = ["api", "key", "token", "tokens", "access", "max", "secret", "page", "next", "github",
              "user", "password", "session", "id", "client", "cache", "prompt", "auth", "x"]


def _render(parts: list[str], style: int) -> str:
    if style == 0:
        return "_".join(parts)
    if style == 1:
        return "-".join(p.upper() for p in parts)
    if style == 2:
        return parts[0] + "".join(p.capitalize() for p in parts[1:])
    if style == 3:
        return ".".join(p.capitalize() for p in parts)
    return "[" + "][".join(parts) + "]"


@given(st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=4), st.integers(0, 4), st.booleans())
def test_spelling_never_changes_the_answer(parts: list[str], style: int, flat: bool) -> None:
    """snake_case, KEBAB-CASE, camelCase, Dotted.Pascal and [bracketed] spell the same name."""
    assert is_credential_name(_render(parts, style), flat) == is_credential_name("_".join(parts), flat)


@given(st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=4))
def test_a_plural_token_count_is_never_a_credential(parts: list[str]) -> None:
    """``…_tokens`` (counts: ``max_tokens``, ``budget_tokens``) never matches the ``token`` rule."""
    assert not is_credential_name("_".join([*parts, "tokens"]))
