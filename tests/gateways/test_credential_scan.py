"""Credential passthrough detection: every provider shape, in every place a request can carry it.

Every fake credential is generated here from random characters of the right alphabet and length;
no real key is pasted anywhere.
"""

from __future__ import annotations

import base64
import json
import random
import string
import uuid
from collections.abc import Callable
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.errors import Reason
from contract.secret import Secret
from gateways.credential_scan import (
    HELD_SECRET,
    PATTERNS,
    CredentialPattern,
    CredentialScanner,
    Finding,
    literal_prefixes,
    percent_decoded,
)

ALNUM = string.ascii_letters + string.digits
B64URL = ALNUM + "-_"
HEX = "0123456789abcdef"
UPPER_DIGITS = string.ascii_uppercase + string.digits


def chars(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def b64(rng: random.Random, n: int) -> str:
    return base64.b64encode(rng.randbytes(n)).decode()


Generator = Callable[[random.Random], str]
GENERATORS: dict[str, Generator] = {
    "github_classic_pat": lambda r: "ghp_" + chars(r, ALNUM, 36),
    "github_oauth": lambda r: "gho_" + chars(r, ALNUM, 36),
    "github_user_to_server": lambda r: "ghu_" + chars(r, ALNUM, 36),
    "github_server_to_server": lambda r: "ghs_" + chars(r, ALNUM, 36),
    "github_refresh": lambda r: "ghr_" + chars(r, ALNUM, 36),
    "github_fine_grained_pat": lambda r: f"github_pat_{chars(r, ALNUM, 22)}_{chars(r, ALNUM, 59)}",
    "anthropic": lambda r: r.choice(["sk-ant-api03-", "sk-ant-admin01-"]) + chars(r, B64URL, 93) + "AA",
    "openai_project": lambda r: "sk-proj-" + chars(r, B64URL, 156),
    "openai_service_account": lambda r: "sk-svcacct-" + chars(r, B64URL, 156),
    "openai_admin": lambda r: "sk-admin-" + chars(r, B64URL, 156),
    "openai": lambda r: "sk-" + chars(r, ALNUM, 48),
    "slack_bot": lambda r: (
        f"xoxb-{chars(r, string.digits, 12)}-{chars(r, string.digits, 13)}-" + chars(r, ALNUM, 24)
    ),
    "slack_user": lambda r: (
        f"xoxp-{chars(r, string.digits, 11)}-{chars(r, string.digits, 12)}-" + chars(r, HEX, 32)
    ),
    "slack_legacy": lambda r: f"xox{r.choice('ars')}-{chars(r, string.digits, 10)}-{chars(r, ALNUM, 30)}",
    "slack_refresh": lambda r: r.choice(["xoxe.xoxp-1-", "xoxe.xoxb-1-", "xoxe-1-"]) + chars(r, ALNUM, 140),
    "slack_app": lambda r: (
        f"xapp-1-A{chars(r, UPPER_DIGITS, 10)}-{chars(r, string.digits, 13)}-" + chars(r, HEX, 64)
    ),
    "slack_webhook": lambda r: (
        f"https://hooks.slack.com/services/T{chars(r, UPPER_DIGITS, 8)}/"
        f"B{chars(r, UPPER_DIGITS, 10)}/{chars(r, ALNUM, 24)}"
    ),
    "aws_access_key_id": lambda r: r.choice(["AKIA", "ASIA", "ABIA", "ACCA"]) + chars(r, UPPER_DIGITS, 16),
    "google_api_key": lambda r: "AIza" + chars(r, B64URL, 35),
    "stripe_secret": lambda r: f"sk_{r.choice(['live', 'test'])}_{chars(r, ALNUM, r.choice([24, 99]))}",
    "stripe_restricted": lambda r: f"rk_{r.choice(['live', 'test'])}_{chars(r, ALNUM, r.choice([24, 99]))}",
    "gitlab_pat": lambda r: "glpat-" + chars(r, B64URL, 20),
    "huggingface": lambda r: "hf_" + chars(r, string.ascii_letters, 34),
    "npm": lambda r: "npm_" + chars(r, ALNUM, 36),
    "pypi": lambda r: "pypi-AgEIcHlwaS5vcmc" + chars(r, B64URL, 150),
    "private_key": lambda r: (
        "-----BEGIN "
        + r.choice(["", "RSA ", "EC ", "OPENSSH ", "ENCRYPTED ", "PGP "])
        + "PRIVATE KEY-----\n"
        + b64(r, 48)
    ),
    "twilio_api_key": lambda r: "SK" + chars(r, HEX, 32),
    "sendgrid": lambda r: f"SG.{chars(r, B64URL, 22)}.{chars(r, B64URL, 43)}",
    "digitalocean": lambda r: f"do{r.choice('opr')}_v1_{chars(r, HEX, 64)}",
    "azure_storage_key": lambda r: "AccountKey=" + b64(r, 64),
}
# one fixed sample per pattern, so a failing id is reproducible
FAKES = {name: gen(random.Random(name)) for name, gen in GENERATORS.items()}


def pct(value: str) -> str:
    return "".join(f"%{byte:02X}" for byte in value.encode())


def basic(user: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{password}".encode())


def multipart(value: str) -> bytes:
    return (
        b'--XyZ\r\nContent-Disposition: form-data; name="note"\r\n\r\nhello\r\n'
        b'--XyZ\r\nContent-Disposition: form-data; name="token"\r\n\r\n' + value.encode() + b"\r\n--XyZ--\r\n"
    )


Scan = Callable[[CredentialScanner, str], Finding | None]
CARRIERS: dict[str, tuple[Scan, str]] = {
    "bearer": (
        lambda s, v: s.scan_headers([(b"authorization", b"Bearer " + v.encode())]),
        "header:authorization",
    ),
    "x-api-key": (lambda s, v: s.scan_headers([(b"x-api-key", v.encode())]), "header:x-api-key"),
    "basic-user": (
        lambda s, v: s.scan_headers([(b"authorization", basic(v, "x"))]),
        "header:authorization:basic-user",
    ),
    "basic-password": (
        lambda s, v: s.scan_headers([(b"authorization", basic("me", v))]),
        "header:authorization:basic-password",
    ),
    "proxy-bearer": (
        lambda s, v: s.scan_headers([(b"host", b"api"), (b"proxy-authorization", b"Bearer " + v.encode())]),
        "header:proxy-authorization",
    ),
    "proxy-basic": (
        lambda s, v: s.scan_headers([(b"proxy-authorization", basic("me", v))]),
        "header:proxy-authorization:basic-password",
    ),
    "cookie": (
        lambda s, v: s.scan_headers([(b"cookie", f"theme=dark; session={v}; lang=en".encode())]),
        "cookie:session",
    ),
    "query-raw": (lambda s, v: s.scan_query(f"a=1&token={v}&b=2".encode()), "query:token"),
    "query-encoded": (lambda s, v: s.scan_query(f"a=1&token={pct(v)}".encode()), "query:token"),
    "query-double-encoded": (
        lambda s, v: s.scan_query(f"token={pct(pct(v))}&b=2".encode()),
        "query:token",
    ),
    "json-value": (
        lambda s, v: s.scan_body(json.dumps({"model": "m", "api_key": v}).encode(), "application/json"),
        "body:json",
    ),
    "json-key": (lambda s, v: s.scan_body(json.dumps({v: 1}).encode(), "application/json"), "body:json"),
    "json-unicode-escapes": (
        lambda s, v: s.scan_body(
            ('{"k": "' + "".join(f"\\u{ord(c):04x}" for c in v) + '"}').encode(),
            "application/vnd.api+json; charset=utf-8",
        ),
        "body:json",
    ),
    "json-nested-arrays": (
        lambda s, v: s.scan_body(json.dumps({"a": [[1, [{"b": ["x", [v]]}]]]}).encode(), "application/json"),
        "body:json",
    ),
    "json-after-escaped-newline": (
        lambda s, v: s.scan_body(json.dumps({"k": f"line one\n{v}", "q": 'say "hi"'}).encode(),
                                 "application/json"),
        "body:json",
    ),
    "json-unparsable": (lambda s, v: s.scan_body(f'{{"k": "{v}'.encode(), "application/json"), "body:json"),
    "form": (
        lambda s, v: s.scan_body(
            f"a=1&token={quote(v, safe='')}".encode(), "application/x-www-form-urlencoded"
        ),
        "body:form",
    ),
    "multipart": (
        lambda s, v: s.scan_body(multipart(v), "multipart/form-data; boundary=XyZ"),
        "body:multipart",
    ),
    "text-plain": (lambda s, v: s.scan_body(f"key: {v}\n".encode(), "text/plain"), "body:raw"),
}


def everywhere(scanner: CredentialScanner, value: str) -> list[Finding]:
    findings = (scan(scanner, value) for scan, _ in CARRIERS.values())
    return [f for f in findings if f is not None]


@pytest.fixture(scope="module")
def scanner() -> CredentialScanner:
    return CredentialScanner()


def test_every_pattern_has_a_generator() -> None:
    assert set(GENERATORS) == {p.name for p in PATTERNS}


@pytest.mark.parametrize(
    ("name", "carrier"),
    [
        pytest.param(name, carrier, id=f"{name}-{carrier}")
        for name in GENERATORS
        for carrier in CARRIERS
        # RFC 7617: a user-id cannot contain ':'; a URL-shaped credential cannot be a Basic user
        if not (carrier == "basic-user" and ":" in FAKES[name])
    ],
)
def test_credential_found_in_every_location(scanner: CredentialScanner, name: str, carrier: str) -> None:
    scan, location = CARRIERS[carrier]
    assert scan(scanner, FAKES[name]) == Finding(location, name)


@pytest.mark.parametrize("name", list(GENERATORS))
def test_find_names_the_pattern_only(scanner: CredentialScanner, name: str) -> None:
    found = scanner.find(FAKES[name])
    assert found is not None
    assert found.name == name
    assert found in PATTERNS
    assert scanner.find(FAKES[name].encode()) == found


def jwt_like(rng: random.Random) -> str:
    header = {
        "alg": rng.choice(["ES256", "EdDSA", "RS256", "HS256"]),
        "typ": "JWT",
        "kid": chars(rng, B64URL, 12),
    }
    claims = {
        "sub": str(uuid.UUID(int=rng.getrandbits(128))),
        "aud": rng.choice(["github", "openai", "anthropic", "slack"]),
        "purposes": [
            chars(rng, string.ascii_lowercase + ":", rng.randint(3, 20)) for _ in range(rng.randint(0, 4))
        ],
        "exp": rng.randint(1_700_000_000, 2_000_000_000),
        "jti": chars(rng, B64URL, 22),
    }

    def seg(obj: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    if rng.random() < 0.5:
        # random base64url segments of JWT shape (header and payload of a JSON object start "eyJ")
        return (
            f"eyJ{chars(rng, B64URL, rng.randint(20, 80))}.eyJ{chars(rng, B64URL, rng.randint(40, 400))}."
            + chars(rng, B64URL, rng.choice([43, 86, 342]))
        )
    signature = base64.urlsafe_b64encode(rng.randbytes(rng.choice([32, 64, 256]))).rstrip(b"=").decode()
    return f"{seg(header)}.{seg(claims)}.{signature}"


def test_jwt_run_tokens_never_match(scanner: CredentialScanner) -> None:
    rng = random.Random(20240601)
    tokens = [jwt_like(rng) for _ in range(1000)]
    assert [t for t in tokens if scanner.find(t) is not None] == []
    assert scanner.scan_headers([(b"authorization", b"Bearer " + t.encode()) for t in tokens]) is None
    assert scanner.scan_body(json.dumps({"tokens": tokens}).encode(), "application/json") is None


SEGMENT_SHAPED = [name for name, value in FAKES.items() if set(value) <= set(B64URL)]


@pytest.mark.parametrize("name", SEGMENT_SHAPED)
def test_no_match_starts_inside_a_jwt(scanner: CredentialScanner, name: str) -> None:
    # a match may not start after '.', '-', '_' or an alphanumeric: a segment or its tail never matches
    fake = FAKES[name]
    for token in (f"eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0.{fake}", f"eyJhbGciOiJFUzI1NiJ9.eyJz-{fake}.c2ln"):
        assert scanner.find(token) is None
        assert scanner.find(f"Bearer x_{fake}") is None


NEGATIVES = [
    pytest.param("", id="empty"),
    pytest.param(str(uuid.UUID(int=random.Random(1).getrandbits(128))), id="uuid"),
    pytest.param(str(uuid.UUID(int=random.Random(2).getrandbits(128))).upper(), id="uuid-upper"),
    pytest.param(chars(random.Random(3), HEX, 40), id="git-sha1"),
    pytest.param(chars(random.Random(4), HEX, 64), id="git-sha256"),
    pytest.param("please add this to the task-list and ask-me later, it is risk-free", id="english-sk"),
    pytest.param(
        "whisk-antelope-migration-season-notes and desk-top-organizer-for-offices", id="english-sk-ant"
    ),
    pytest.param('<div class="sk-fading-circle-spinner-animation-container">', id="kebab-css-sk"),
    pytest.param("def 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(): pass", id="snake-hf"),
    pytest.param("sk-short sk-ant-short ghp_short AKIA12 xoxb-1 glpat-abc npm_x SG.a.b", id="short-prefixes"),
    pytest.param("SKU-000123 ASIAN-FOOD AIzaShort SK-not-hex", id="uppercase-words"),
    pytest.param("https://hooks.slack.com/services/", id="webhook-base-url"),
    pytest.param("-----BEGIN PUBLIC KEY-----", id="public-key"),
    pytest.param("-----BEGIN CERTIFICATE-----", id="certificate"),
    pytest.param("AccountName=devstore;AccountKey=", id="empty-account-key"),
    pytest.param(base64.b64encode(random.Random(5).randbytes(3000)).decode(), id="base64-blob"),
    pytest.param(base64.urlsafe_b64encode(random.Random(6).randbytes(3000)).decode(), id="base64url-blob"),
    pytest.param(base64.b64encode(random.Random(7).randbytes(64)).decode(), id="base64-short"),
]


@pytest.mark.parametrize("value", NEGATIVES)
def test_ordinary_values_pass(scanner: CredentialScanner, value: str) -> None:
    assert scanner.find(value) is None
    assert everywhere(scanner, value) == []


def test_empty_inputs(scanner: CredentialScanner) -> None:
    assert scanner.scan_headers([]) is None
    assert scanner.scan_headers([(b"authorization", b""), (b"cookie", b""), (b"x", b"")]) is None
    assert scanner.scan_query(b"") is None
    assert scanner.scan_query(b"&&=&=x&y=") is None
    for body in (b"", b"{}", b"[]", b"null", b'""'):
        assert scanner.scan_body(body, "application/json") is None


@pytest.mark.parametrize("name", list(GENERATORS))
def test_reprs_never_carry_the_value(scanner: CredentialScanner, name: str) -> None:
    value = FAKES[name]
    findings = everywhere(scanner, value)
    pattern = scanner.find(value)
    assert findings
    assert pattern is not None
    for shown in [*map(repr, findings), *map(str, findings), repr(pattern), str(pattern)]:
        assert value not in shown
        assert value[-16:] not in shown  # the random tail: a fixed prefix is in the regex


@pytest.mark.parametrize(
    ("scan", "location"),
    [
        pytest.param(lambda s, v: s.scan_query(f"{v}=1".encode()), "query:<redacted>", id="query-name"),
        pytest.param(lambda s, v: s.scan_query(f"{pct(v)}".encode()), "query:<redacted>", id="query-bare"),
        pytest.param(
            lambda s, v: s.scan_headers([(b"cookie", f"{v}=1".encode())]), "cookie:<redacted>", id="cookie"
        ),
        pytest.param(
            lambda s, v: s.scan_headers([(v.encode(), b"1")]), "header:<redacted>", id="header-name"
        ),
    ],
)
def test_a_name_that_is_the_credential_is_not_echoed(
    scanner: CredentialScanner, scan: Scan, location: str
) -> None:
    value = FAKES["github_classic_pat"]
    assert scan(scanner, value) == Finding(location, "github_classic_pat")


def test_a_name_that_is_not_a_plain_token_is_not_echoed(scanner: CredentialScanner) -> None:
    query = f"{pct('x y<script>')}={FAKES['npm']}".encode()
    assert scanner.scan_query(query) == Finding("query:<redacted>", "npm")


def test_azure_connection_string_in_a_cookie(scanner: CredentialScanner) -> None:
    cookie = f"conn=DefaultEndpointsProtocol=https;AccountName=dev;{FAKES['azure_storage_key']}"
    assert scanner.scan_headers([(b"cookie", cookie.encode())]) == Finding(
        "cookie:AccountKey", "azure_storage_key"
    )


def test_basic_with_bad_base64_is_opaque(scanner: CredentialScanner) -> None:
    assert scanner.scan_headers([(b"authorization", b"Basic !!not*base64!!")]) is None
    assert scanner.scan_headers([(b"authorization", b"Basic")]) is None
    unpadded = base64.b64encode(f"u:{FAKES['gitlab_pat']}".encode()).rstrip(b"=")
    assert scanner.scan_headers([(b"Authorization", b"basic " + unpadded)]) == Finding(
        "header:authorization:basic-password", "gitlab_pat"
    )


def test_percent_decoding_stops_after_two_rounds() -> None:
    assert percent_decoded(b"a%25252541") == [b"a%25252541", b"a%252541", b"a%2541"]
    assert percent_decoded(b"plain") == [b"plain"]
    assert percent_decoded(b"a+b") == [b"a+b", b"a b"]


def test_held_secrets_count_as_passthrough() -> None:
    held = "correct horse battery staple 42"
    scanner = CredentialScanner(extra_exact=[held, Secret("another-held-value-123"), "short"])
    assert "correct" not in repr(scanner)
    assert scanner.find(f"x{held}x") is HELD_SECRET
    assert scanner.scan_query(f"q={pct(held)}".encode()) == Finding("query:q", "held_secret")
    assert scanner.scan_headers([(b"authorization", basic("me", "another-held-value-123"))]) == Finding(
        "header:authorization:basic-password", "held_secret"
    )
    assert scanner.find("short and sweet") is None  # below MIN_EXACT_LENGTH: ignored, not everything refused
    assert CredentialScanner().find(held) is None


def test_finding_carries_the_reason_code() -> None:
    assert Finding("header:x", "npm").reason is Reason.CREDENTIAL_PASSTHROUGH
    assert Reason.CREDENTIAL_PASSTHROUGH.value == "credential_passthrough"


@pytest.mark.parametrize(
    ("patterns", "message"),
    [
        pytest.param([PATTERNS[0], PATTERNS[0]], "unique", id="duplicate-name"),
        pytest.param([CredentialPattern("held_secret", "x", "abc")], "unique", id="reserved-name"),
        pytest.param([CredentialPattern("bad", "x", "ab[")], "'bad': bad regex", id="bad-regex"),
        pytest.param([CredentialPattern("grp", "x", "a(b)")], "'grp': start the regex", id="capturing-group"),
        pytest.param([CredentialPattern("cls", "x", "[ab]c")], "'cls': start the regex", id="class-first"),
        pytest.param([CredentialPattern("opt", "x", "a?b")], "'opt': start the regex", id="quantified-first"),
        pytest.param([CredentialPattern("uni", "x", "é+")], "'uni': bad regex", id="non-ascii"),
    ],
)
def test_bad_pattern_tables_are_refused(patterns: list[CredentialPattern], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CredentialScanner(patterns)


CONTENT_TYPES = [
    "application/json",
    "application/x-www-form-urlencoded",
    "multipart/form-data",
    "text/plain",
    "",
]


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=2048), content_type=st.sampled_from(CONTENT_TYPES) | st.text(max_size=40))
def test_random_bytes_never_crash(scanner: CredentialScanner, data: bytes, content_type: str) -> None:
    scanner.find(data)
    scanner.scan_query(data)
    scanner.scan_body(data, content_type)
    scanner.scan_headers(
        [(b"authorization", data), (b"proxy-authorization", b"Basic " + data), (b"cookie", data)]
    )


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=512))
def test_random_text_never_crashes(scanner: CredentialScanner, text: str) -> None:
    scanner.find(text)
    scanner.scan_body(json.dumps({text: [text]}).encode(), "application/json")


# non-alphanumeric, and not '_', '-' or '.': those continue a token, so a match may not start after them
SEPARATORS = st.text(st.characters(exclude_categories=("L", "N", "Cs"), exclude_characters="_-."), max_size=6)


@settings(max_examples=400, deadline=None)
@given(
    name=st.sampled_from(sorted(GENERATORS)), seed=st.integers(0, 2**64), before=SEPARATORS, after=SEPARATORS
)
def test_embedded_credential_is_always_found(
    scanner: CredentialScanner, name: str, seed: int, before: str, after: str
) -> None:
    value = before + GENERATORS[name](random.Random(seed)) + after
    found = scanner.find(value)
    assert found is not None
    assert found.name == name
    assert scanner.scan_body(json.dumps({"v": value}).encode(), "application/json") == Finding(
        "body:json", name
    )


@pytest.mark.parametrize(("regex", "prefixes"), [
    pytest.param("ghp_[A-Za-z0-9]{36}", ["ghp_"], id="literal-then-class"),
    pytest.param("xox[ars]-[A-Za-z0-9-]{10,}", ["xoxa-", "xoxr-", "xoxs-"], id="small-class-expanded"),
    pytest.param("sk_(?:live|test)_[A-Za-z0-9]{20,}", ["sk_live_", "sk_test_"], id="group-expanded"),
    pytest.param(r"xoxe(?:\.xox[bp])?-[A-Za-z0-9-]{10,}", ["xoxe"], id="optional-group-stops"),
    pytest.param(r"hooks\.slack\.com/x", ["hooks.slack.com/x"], id="escaped-punctuation"),
    pytest.param("sk-(?!ant-)[A-Za-z0-9]{20,}", ["sk-"], id="lookahead-stops"),
    pytest.param("ab?c", ["a"], id="optional-char-stops"),
    pytest.param("ab*", ["a"], id="repeated-char-stops"),
    pytest.param("a.b", ["a"], id="wildcard-stops"),
    pytest.param("A[A-Z]B", ["A"], id="range-class-stops"),
    pytest.param("x(?:a|b|c|d|e)(?:a|b|c|d|e)", ["xa", "xb", "xc", "xd", "xe"], id="at-most-16"),
])
def test_literal_prefixes(regex: str, prefixes: list[str]) -> None:
    assert literal_prefixes(regex) == prefixes


@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: p.name)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_every_match_starts_with_a_prefix(pattern: CredentialPattern, data: st.DataObject) -> None:
    """The prefilter is sound: a string the pattern matches always begins with one of its prefixes,
    and the scanner (prefilter, then the regex) finds it."""
    value = data.draw(st.from_regex(pattern.regex, fullmatch=True, alphabet=st.characters(
        codec="ascii", categories=("L", "N", "P", "S", "Zs"))))
    assert value.startswith(tuple(literal_prefixes(pattern.regex)))
    found = CredentialScanner([pattern]).find(f"x {value} y")
    assert found is not None
    assert found.name == pattern.name


@pytest.mark.parametrize("body", [
    pytest.param(json.dumps(["ghp_", "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"]), id="split-across-strings"),
    pytest.param(json.dumps(["ghp_\n", "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"]), id="split-escaped"),
    pytest.param(json.dumps({"ghp_": "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8\t"}), id="split-key-value"),
])
def test_json_strings_are_scanned_one_by_one(scanner: CredentialScanner, body: str) -> None:
    """A credential shape made only by putting two JSON strings side by side is not a finding."""
    assert scanner.scan_body(body.encode(), "application/json") is None


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-8-sig"])
def test_json_in_any_encoding_json_loads_reads(scanner: CredentialScanner, encoding: str) -> None:
    """json.loads reads UTF-16/32 too (and so may the upstream): the raw-bytes shortcut is UTF-8 only."""
    body = json.dumps({"k": "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"}).encode(encoding)
    assert scanner.scan_body(body, "application/json") == Finding("body:json", "github_classic_pat")


@pytest.mark.parametrize(("held", "headers", "query"), [
    pytest.param("hunter2;long-held-value", [(b"cookie", b"sid=hunter2;long-held-value")], b"",
                 id="cookie-value-holds-the-separator"),
    pytest.param("hunter2&long-held-value", [], b"q=hunter2&long-held-value", id="query-value-holds-the-separator"),
    pytest.param("held=value;with-both&seps", [(b"x-note", b"a held=value;with-both&seps b")], b"",
                 id="plain-header-value"),
])
def test_a_finding_the_place_scan_cannot_place_still_refuses(
        held: str, headers: list[tuple[bytes, bytes]], query: bytes) -> None:
    """The whole-block pass finds the held secret; splitting on ';' or '&' to name the place cannot.
    That must never turn into 'allowed'."""
    scanner = CredentialScanner(extra_exact=[Secret(held)])
    finding = scanner.scan_headers(headers) or scanner.scan_query(query)
    assert finding is not None
    assert finding.reason is Reason.CREDENTIAL_PASSTHROUGH
    assert held not in finding.location
