"""Path templates: what compiles, what matches, and which bound values could widen a template."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.templates import PathTemplate, TemplateError, value_widens


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param("v1/items", "must start with '/'", id="relative"),
        pytest.param("", "must start with '/'", id="empty"),
        pytest.param("/v1/items/*", "wildcard", id="star"),
        pytest.param("/v1/*/items", "wildcard", id="star-middle"),
        pytest.param("/v1/items?page=2", "query", id="query"),
        pytest.param("/v1/items#top", "fragment", id="fragment"),
        pytest.param("/v1/%2e%2e/admin", "escape", id="percent-escape"),
        pytest.param("/v1//items", "empty segment", id="double-slash"),
        pytest.param("/v1/items//", "empty segment", id="two-trailing-slashes"),
        pytest.param("/**", "at least one literal segment", id="tail-alone"),
        pytest.param("/{a}/**", "at least one literal segment", id="tail-after-param-only"),
        pytest.param("/{a}/", "at least one literal segment", id="trailing-slash-param-only"),
        pytest.param("/v1/**/x", "wildcard", id="tail-not-last"),
        pytest.param("/v1/a**", "wildcard", id="tail-glued-to-text"),
        pytest.param("/v1/***", "wildcard", id="three-stars"),
        pytest.param("/v1/**/**", "wildcard", id="two-tails"),
        pytest.param("/v1/**/", "wildcard", id="tail-then-slash"),
        pytest.param("/v1//**", "empty segment", id="tail-after-empty-segment"),
        pytest.param("/v1/*", "wildcard", id="single-star-tail"),
        pytest.param("/v1/../admin", "'.' or '..' segment", id="dotdot"),
        pytest.param("/v1/./items", "'.' or '..' segment", id="dot"),
        pytest.param("/..", "'.' or '..' segment", id="only-dotdot"),
        pytest.param("/{path}", "'/{path}' matches every path", id="one-param"),
        pytest.param("/{a}/{b}", "'/{a}/{b}' matches every path", id="two-params"),
        pytest.param("/", "at least one literal segment", id="root"),
        pytest.param("/v1/{Owner}", "lower-case letters", id="param-upper-case"),
        pytest.param("/v1/{}", "lower-case letters", id="param-empty"),
        pytest.param("/v1/{owner-name}", "lower-case letters", id="param-dash"),
        pytest.param("/v1/{" + "a" * 65 + "}", "lower-case letters", id="param-too-long"),
        pytest.param("/v1/{a}/{a}", "appears twice", id="param-twice"),
        pytest.param("/v1/x{a}", "mixes text and a parameter", id="param-after-text"),
        pytest.param("/v1/{a}.json", "mixes text and a parameter", id="param-before-text"),
        pytest.param("/v1/{{a}}", "mixes text and a parameter", id="double-braces"),
        pytest.param("/v1/{a}{b}", "mixes text and a parameter", id="two-params-one-segment"),
        pytest.param("/v1/it ems", "characters outside", id="space"),
        pytest.param("/v1/caf\u00e9", "characters outside", id="non-ascii"),
        pytest.param("/v1/a\\b", "characters outside", id="backslash"),
        pytest.param("/v1/a;b", "characters outside", id="semicolon"),
    ],
)
def test_parse_rejects(raw: str, message: str) -> None:
    with pytest.raises(TemplateError) as info:
        PathTemplate.parse(raw)

    assert message in str(info.value)


@pytest.mark.parametrize(
    ("raw", "segments", "names"),
    [
        pytest.param("/v1/models", ("v1", "models"), (), id="literal"),
        pytest.param("/api/chat.postMessage", ("api", "chat.postMessage"), (), id="dotted"),
        pytest.param("/repos/{owner}/{repo}", ("repos", None, None), ("owner", "repo"),
                     id="params"),
        pytest.param("/{owner}/{repo}/info/refs", (None, None, "info", "refs"), ("owner", "repo"),
                     id="leading-params"),
        pytest.param("/v1/{_id}/x", ("v1", None, "x"), ("_id",), id="underscore-param"),
        pytest.param("/users/@me/a:b+c=d,e!$~", ("users", "@me", "a:b+c=d,e!$~"), (),
                     id="punctuation"),
    ],
)
def test_parse_accepts(raw: str, segments: tuple[str | None, ...], names: tuple[str, ...]) -> None:
    template = PathTemplate.parse(raw)

    assert not template.tail

    assert (template.raw, template.segments, template.names) == (raw, segments, names)
    assert template.params == frozenset(names)
    assert str(template) == raw


@pytest.mark.parametrize(
    ("raw", "segments", "names"),
    [
        pytest.param("/packages/**", ("packages",), (), id="literal-tail"),
        pytest.param("/repos/{owner}/{repo}/**", ("repos", None, None), ("owner", "repo"),
                     id="params-then-tail"),
        pytest.param("/a/b/c/**", ("a", "b", "c"), (), id="deep-tail"),
    ],
)
def test_parse_accepts_a_tail(raw: str, segments: tuple[str | None, ...], names: tuple[str, ...]) -> None:
    template = PathTemplate.parse(raw)

    assert (template.segments, template.names, template.tail) == (segments, names, True)
    assert str(template) == raw


def test_trailing_slash_is_a_final_empty_segment() -> None:
    template = PathTemplate.parse("/simple/{package}/")

    assert (template.segments, template.tail) == (("simple", None, ""), False)


ISSUE = "/repos/{owner}/{repo}/issues/{number}"
OCTO = {"owner": "octo", "repo": "hello"}


@pytest.mark.parametrize(
    ("template", "path", "bound", "expected"),
    [
        pytest.param("/v1/models", "v1/models", {}, True, id="literal"),
        pytest.param("/v1/models", "v1/model", {}, False, id="literal-differs"),
        pytest.param("/v1/models", "V1/models", {}, False, id="literal-case-sensitive"),
        pytest.param(ISSUE, "repos/octo/hello/issues/7", OCTO, True, id="bound-substituted"),
        pytest.param(ISSUE, "repos/evil/hello/issues/7", OCTO, False, id="bound-differs"),
        pytest.param(ISSUE, "repos/OCTO/hello/issues/7", OCTO, False, id="bound-case-sensitive"),
        pytest.param(ISSUE, "repos/octo/hello/issues/7", {**OCTO, "number": "7"}, True,
                     id="all-bound"),
        pytest.param(ISSUE, "repos/octo/hello/issues/8", {**OCTO, "number": "7"}, False,
                     id="all-bound-differs"),
        pytest.param(ISSUE, "repos/octo/hello/issues/anything-at-all", OCTO, True,
                     id="unbound-any-segment"),
        pytest.param(ISSUE, "repos/a/b/issues/c", {}, True, id="nothing-bound"),
        pytest.param(ISSUE, "repos/octo/hello/issues/", OCTO, False, id="unbound-empty"),
        pytest.param(ISSUE, "repos/octo/hello/issues/.", OCTO, False, id="unbound-dot"),
        pytest.param(ISSUE, "repos/octo/hello/issues/..", OCTO, False, id="unbound-dotdot"),
        pytest.param(ISSUE, "repos/octo/hello/issues/7/comments", OCTO, False, id="longer"),
        pytest.param(ISSUE, "repos/octo/hello/issues", OCTO, False, id="shorter"),
        pytest.param(ISSUE, "", OCTO, False, id="no-segments"),
        pytest.param(ISSUE, "repos/octo/hello/issues/7", {**OCTO, "extra": "x"}, True,
                     id="extra-binding-ignored"),
    ],
)
def test_matches(template: str, path: str, bound: Mapping[str, str], expected: bool) -> None:
    segments = tuple(path.split("/")) if path else ()

    assert PathTemplate.parse(template).matches(segments, bound) is expected


PKG = "/packages/**"
REPO_TAIL = "/repos/{owner}/{repo}/**"
SIMPLE = "/simple/{package}/"


@pytest.mark.parametrize(
    ("template", "segments", "bound", "expected"),
    [
        pytest.param(PKG, ("packages",), {}, True, id="tail-zero-segments"),
        pytest.param(PKG, ("packages", "a"), {}, True, id="tail-one-segment"),
        pytest.param(PKG, ("packages", "a", "b", "c.whl"), {}, True, id="tail-many-segments"),
        pytest.param(PKG, ("packages", "a", ""), {}, True, id="tail-trailing-slash"),
        pytest.param(PKG, ("packages", ""), {}, True, id="tail-directory-itself"),
        pytest.param(PKG, (), {}, False, id="tail-root"),
        pytest.param(PKG, ("packagesX",), {}, False, id="tail-never-a-prefix-of-a-segment"),
        pytest.param(PKG, ("packagesX", "a"), {}, False, id="tail-longer-first-segment"),
        pytest.param(PKG, ("Packages", "a"), {}, False, id="tail-case-sensitive"),
        pytest.param(PKG, ("other", "packages"), {}, False, id="tail-other-prefix"),
        pytest.param(PKG, ("packages", "..", "admin"), {}, False, id="tail-dotdot"),
        pytest.param(PKG, ("packages", "a", ".."), {}, False, id="tail-dotdot-last"),
        pytest.param(PKG, ("packages", "."), {}, False, id="tail-dot"),
        pytest.param(PKG, ("packages", "", "a"), {}, False, id="tail-empty-middle"),
        pytest.param(PKG, ("packages", "a", "", ""), {}, False, id="tail-two-trailing-slashes"),
        pytest.param(PKG, ("packages", "a/../../admin"), {}, False, id="tail-decoded-slash"),
        pytest.param(REPO_TAIL, ("repos", "octo", "hello", "pulls", "1"), OCTO, True,
                     id="tail-after-bound-params"),
        pytest.param(REPO_TAIL, ("repos", "octo", "hello"), OCTO, True, id="tail-bound-zero"),
        pytest.param(REPO_TAIL, ("repos", "evil", "hello", "pulls"), OCTO, False,
                     id="tail-bound-differs"),
        pytest.param(REPO_TAIL, ("repos", "octo"), OCTO, False, id="tail-prefix-too-short"),
        pytest.param(REPO_TAIL, ("repos", "octo", "hello", "x"), {"owner": "..", "repo": "hello"},
                     False, id="tail-widening-bound-value"),
        pytest.param(REPO_TAIL, ("repos", "", "hello"), {}, False, id="tail-unbound-empty"),
        pytest.param(SIMPLE, ("simple", "requests", ""), {}, True, id="trailing-slash"),
        pytest.param(SIMPLE, ("simple", "requests"), {}, False, id="trailing-slash-missing"),
        pytest.param(SIMPLE, ("simple", "requests", "", ""), {}, False, id="trailing-slash-twice"),
        pytest.param(SIMPLE, ("simple", "requests", "x"), {}, False, id="trailing-slash-longer"),
        pytest.param(SIMPLE, ("simple", "", ""), {}, False, id="trailing-slash-empty-param"),
        pytest.param("/v1/items", ("v1", "items", ""), {}, False, id="no-slash-template-refuses-slash"),
    ],
)
def test_tail_and_trailing_slash_matching(
    template: str, segments: tuple[str, ...], bound: Mapping[str, str], expected: bool
) -> None:
    assert PathTemplate.parse(template).matches(segments, bound) is expected


def test_unbound_parameter_refuses_a_decoded_slash() -> None:
    """A decoded %2F inside one segment would reach the upstream as two segments."""
    template = PathTemplate.parse(ISSUE)

    assert not template.matches(("repos", "octo", "hello", "issues", "7/comments"), OCTO)


WIDENING = [
    pytest.param("", id="empty"),
    pytest.param(".", id="dot"),
    pytest.param("..", id="dotdot"),
    pytest.param("a/b", id="slash"),
    pytest.param("*", id="star"),
    pytest.param("%2f", id="percent-escape"),
    pytest.param("a b", id="space"),
    pytest.param("a\nb", id="newline"),
    pytest.param("a?b", id="query"),
    pytest.param("a#b", id="fragment"),
    pytest.param("caf\u00e9", id="non-ascii"),
    pytest.param("x" * 201, id="very-long"),
]


@pytest.mark.parametrize("value", WIDENING)
def test_value_widens(value: str) -> None:
    assert value_widens(value)


@pytest.mark.parametrize("value", WIDENING)
def test_widening_bound_value_never_matches(value: str) -> None:
    """Even a request whose segment equals the bad value is refused: fail closed."""
    template = PathTemplate.parse(ISSUE)

    assert not template.matches(("repos", "octo", "hello", "issues", value),
                                {**OCTO, "number": value})


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("octo", id="word"),
        pytest.param("hello-world", id="dash"),
        pytest.param("v1.2.3", id="dots"),
        pytest.param("a_b~c@d+e", id="punctuation"),
        pytest.param("...", id="three-dots"),
        pytest.param("x" * 200, id="longest"),
    ],
)
def test_value_does_not_widen(value: str) -> None:
    template = PathTemplate.parse(ISSUE)

    assert not value_widens(value)
    assert template.matches(("repos", "octo", "hello", "issues", value), {**OCTO, "number": value})


# Property: a template with a tail matches exactly the paths a plain reading of it allows:
# its literal prefix segment for segment, then only whole, non-dot segments (one final empty one
# for a trailing slash). Segments come from a small alphabet so that near misses are common.
_SEG = st.sampled_from(["a", "b", "ab", "", ".", "..", "a/b", "A", "a.b", "%2e"])


def _reference(prefix: list[str], tail: bool, path: tuple[str, ...]) -> bool:
    if tuple(path[: len(prefix)]) != tuple(prefix):
        return False
    rest = path[len(prefix):]
    if not tail:
        return not rest
    body = rest[:-1] if rest and rest[-1] == "" else rest
    return all(s not in ("", ".", "..") and "/" not in s for s in body)


@settings(max_examples=400, deadline=None)
@given(prefix=st.lists(st.sampled_from(["a", "b", "ab", "a.b"]), min_size=1, max_size=3),
       tail=st.booleans(), path=st.lists(_SEG, max_size=6))
def test_tail_never_widens_past_its_prefix(prefix: list[str], tail: bool, path: list[str]) -> None:
    template = PathTemplate.parse("/" + "/".join(prefix) + ("/**" if tail else ""))

    assert template.matches(tuple(path), {}) is _reference(prefix, tail, tuple(path))
