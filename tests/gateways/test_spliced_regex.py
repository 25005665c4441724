"""Spliced regexes are ``re.compile`` of the joined source, and learning a credential's forms
does not hold the event loop (compared in one run with the build it replaced: ``re.compile`` of
every pattern in a worker thread)."""

from __future__ import annotations

import asyncio
import gc
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from re import _compiler, _parser  # type: ignore[attr-defined]

import pytest

from gateways import spliced_regex
from gateways.redact import Redactor
from gateways.secret_forms import texts
from gateways.spliced_regex import _code_of, _concatenation, alternation, concatenation
from gateways.text_regex import compile_text

SECRETS = [
    pytest.param(b"ghs_" + b"A1b2C3d4" * 4 + b"e5F6", id="github-token"),
    pytest.param(b"v1.M2E4Zj-_~+/=.opaque", id="oauth-punctuation"),
    pytest.param(b"A1a-9bC8dE7fG6hH5iJ4", id="vault-password"),
    pytest.param("pässwörd-✓-𝄞-x".encode(), id="utf8"),
    pytest.param(b"latin\xe9\xff-1 bytes", id="latin1"),
]


def test_splicing_is_on_for_this_python() -> None:
    assert spliced_regex.SPLICING


@pytest.mark.parametrize("secret", SECRETS)
def test_each_text_compiles_to_the_code_re_compiles(secret: bytes) -> None:
    for text in texts(secret):
        compiled = compile_text(text)
        for pieces in (compiled.full_pieces, compiled.prefix_pieces):
            source = b"".join(pieces)
            assert _code_of(*_concatenation(tuple(pieces))) == _compiler._code(_parser.parse(source, 0), 0)
            assert concatenation(pieces).pattern == source


@pytest.mark.parametrize("secret", SECRETS)
def test_the_prefix_alternation_finds_what_re_finds(secret: bytes) -> None:
    prefixes = [compile_text(t).prefix_pieces for t in texts(secret)]
    spliced = alternation(prefixes)
    plain = re.compile(spliced.pattern)
    b64 = secret.hex().encode()
    probes = [b"x " + secret[:n] for n in range(1, len(secret) + 1)] + [b"y" + b64[:9], b"nothing", b""]
    for probe in probes:
        for start in range(len(probe) + 1):
            one, other = spliced.search(probe, start), plain.search(probe, start)
            assert (one and one.span()) == (other and other.span())


@pytest.mark.parametrize("secret", SECRETS)
def test_the_held_suffix_patterns_find_what_re_finds(secret: bytes) -> None:
    """The redactor's held-suffix groups (a lead byte with its check, then one text's rest) are
    spliced too: each finds what ``re.compile`` of its source finds, from every start."""
    redactor = Redactor([secret])
    assert redactor._held
    probes = [b"x " + secret[:n] for n in range(1, len(secret) + 1)] + [secret.hex().encode()[:9], b"zz", b""]
    for _, pattern in redactor._held:
        plain = re.compile(pattern.pattern)
        for probe in probes:
            for start in range(len(probe) + 1):
                one, other = pattern.search(probe, start), plain.search(probe, start)
                assert (one and one.span()) == (other and other.span()), (probe, start)


def test_a_spliced_pattern_with_a_group_is_refused() -> None:
    with pytest.raises(ValueError, match="capturing group"):
        spliced_regex._piece(b"(a)")


def test_falls_back_to_re_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spliced_regex, "SPLICING", False)
    secret = b"fallback-secret-1234"
    redactor = Redactor([secret])
    assert redactor.redact(b"a " + secret.hex().encode() + b" b") == (b"a [REDACTED:valetkey] b", 1)


HELD = 0.001  # a wait for a loop turn longer than this counts as the loop held


async def _loop_held(build: Callable[[], Awaitable[Redactor]]) -> tuple[int, float, Redactor]:
    """Loop turns a ticker got while ``build`` ran, and how long in all it waited for turns that
    took over ``HELD``, in this process's CPU time (other processes taking the cores do not
    count). A build in a thread holds the loop one GIL switch interval (5 ms) at a time, for as
    long as it runs; a build in steps, one step at a time, for its own short CPU time."""
    turns, held, done = 0, 0.0, False

    async def tick() -> None:
        nonlocal turns, held
        last = time.process_time()
        while not done:
            await asyncio.sleep(0)
            now = time.process_time()
            if now - last > HELD:
                held += now - last
            turns, last = turns + 1, now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    try:
        redactor = await build()
    finally:
        done = True
        await ticker
    return turns, held, redactor


def test_learning_a_credential_does_not_hold_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    def fresh() -> bytes:
        return ("ghs_" + secrets.token_urlsafe(27)).encode()

    async def scenario() -> None:
        await Redactor.warm()
        spliced = []
        for _ in range(3):
            value = fresh()
            turns, held, redactor = await _loop_held(lambda: Redactor.build([value]))  # noqa: B023
            # the loop ran between the steps: at least once per text of the credential
            assert turns >= redactor.texts
            assert redactor.redact(b"token=" + value) == (b"token=[REDACTED:valetkey]", 1)
            spliced.append(held)
        # the build it replaced, in the same run: every pattern through re.compile, in a thread
        monkeypatch.setattr(spliced_regex, "SPLICING", False)
        threaded = [(await _loop_held(lambda: asyncio.to_thread(Redactor, [fresh()])))[1] for _ in range(2)]
        monkeypatch.setattr(spliced_regex, "SPLICING", True)
        # the loop held for a few ms in all, against most of the threaded build's ~0.3 s
        assert max(spliced) * 3 < min(threaded), (spliced, threaded)

    gc.disable()  # a collection's pause is not what this compares (either build may meet one)
    try:
        asyncio.run(scenario())
    finally:
        gc.enable()
