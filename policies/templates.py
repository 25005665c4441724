"""Path templates with named whole-segment parameters: ``/repos/{owner}/{repo}/issues/{number}``.

A parameter always stands for exactly one path segment. Parameters a run binds are substituted
literally; unbound ones match any single non-empty segment. A bound value can never widen a
template: it is one segment from a small safe alphabet, never ``.``/``..``, never encoded.

Two more forms, both only at the end:

* a tail wildcard ``/**`` as the whole last segment: zero or more further segments, each one
  non-empty and never ``.``/``..`` (``/packages/**`` matches ``/packages``, ``/packages/a/b.whl``
  and the directory ``/packages/a/``, never ``/packagesX`` or ``/other``); the rest of the
  template must still name at least one literal segment;
* a trailing slash (``/simple/{package}/``): the path must end with a slash too (a final empty
  segment in the canonical form), as package indexes and documentation sites expect.

Matching works on canonical segments (decoded once, no empty, ``.`` or ``..`` segment except the
one final empty segment of a trailing slash); anything else never matches.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

PARAM_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")
SAFE_LITERAL = re.compile(r"^[A-Za-z0-9._~@:+=,!$-]+$")
# A bound value is one segment: letters, digits and a few punctuation marks; no '/', '%', '*'.
SAFE_VALUE = re.compile(r"^[A-Za-z0-9._~@+-]{1,200}$")
_PARAM = re.compile(r"^\{([^{}]*)\}$")
TAIL = "**"


class TemplateError(ValueError):
    """A template that cannot be compiled; the message says why and how to fix it."""


def value_widens(value: str) -> bool:
    """True when a bound value could match more than one literal segment."""
    return not SAFE_VALUE.fullmatch(value) or value in (".", "..")


def _one_segment(value: str) -> bool:
    return value not in ("", ".", "..") and "/" not in value


def _tail_ok(rest: tuple[str, ...]) -> bool:
    """What ``/**`` may cover: whole segments, the last of them may be the empty one of a
    trailing slash (``/packages/a/``)."""
    body = rest[:-1] if rest and rest[-1] == "" else rest
    return all(_one_segment(s) for s in body)


@dataclass(frozen=True)
class PathTemplate:
    raw: str
    segments: tuple[str | None, ...]  # None marks a parameter
    names: tuple[str, ...]  # parameter name at each None, in order
    tail: bool = False  # ends in ``/**``: zero or more further segments

    @property
    def params(self) -> frozenset[str]:
        return frozenset(self.names)

    @classmethod
    def parse(cls, raw: str) -> PathTemplate:
        if not raw.startswith("/"):
            raise TemplateError(f"path template {raw!r} must start with '/'")
        tail = raw.endswith("/" + TAIL)
        body = raw[: -len(TAIL) - 1] if tail else raw
        if "*" in body or "?" in raw or "#" in raw or "%" in raw:
            raise TemplateError(
                f"path template {raw!r} contains a wildcard, query, fragment or escape; "
                "name each variable segment as {param}, or end the template with /** "
                "for every path below it"
            )
        parts = body[1:].split("/") if body else []
        segments: list[str | None] = []
        names: list[str] = []
        for index, part in enumerate(parts):
            if part == "" and (index < len(parts) - 1 or tail):
                raise TemplateError(f"path template {raw!r} has an empty segment ('//')")
            if part in (".", ".."):
                raise TemplateError(f"path template {raw!r} contains a '.' or '..' segment")
            match = _PARAM.fullmatch(part)
            if match:
                name = match.group(1)
                if not PARAM_NAME.fullmatch(name):
                    raise TemplateError(
                        f"parameter {{{name}}} in {raw!r} must be lower-case letters, digits, '_'"
                    )
                if name in names:
                    raise TemplateError(f"parameter {{{name}}} appears twice in {raw!r}")
                segments.append(None)
                names.append(name)
            elif "{" in part or "}" in part:
                raise TemplateError(
                    f"segment {part!r} of {raw!r} mixes text and a parameter; "
                    "a parameter must be a whole segment"
                )
            elif part and not SAFE_LITERAL.fullmatch(part):
                raise TemplateError(
                    f"segment {part!r} of {raw!r} has characters outside [A-Za-z0-9._~@:+=,!$-]"
                )
            else:
                segments.append(part)
        if not any(s for s in segments):
            raise TemplateError(
                f"path template {raw!r} matches every path; give it at least one literal segment"
            )
        return cls(raw=raw, segments=tuple(segments), names=tuple(names), tail=tail)

    def matches(self, segments: tuple[str, ...], bound: Mapping[str, str]) -> bool:
        """Match already-normalised, decoded path segments with ``bound`` substituted.

        Fails closed: a bound value that could widen the template never matches, and an unbound
        parameter never matches an empty, ``.``/``..`` or slash-carrying (decoded ``%2F``) segment.
        """
        fixed = len(self.segments)
        if len(segments) < fixed if self.tail else len(segments) != fixed:
            return False
        if self.tail and not _tail_ok(segments[fixed:]):
            return False
        names = iter(self.names)
        for want, got in zip(self.segments, segments[:fixed], strict=True):
            if want is None:
                name = next(names)
                if name in bound:
                    if value_widens(bound[name]) or got != bound[name]:
                        return False
                elif not _one_segment(got):
                    return False
            elif want != got:
                return False
        return True

    def __str__(self) -> str:
        return self.raw
