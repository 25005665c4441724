"""Find a value sent under a credential-named parameter or field, whatever the value looks like.

``gateways/credential_scan.py`` finds credentials by their shape; an internal service's key or a password
has none. This finds them by the name they are sent under (``policies/credential_names.py``):

- each query parameter (split on ``&`` and ``;``), its name raw and percent-decoded twice;
- each ``application/x-www-form-urlencoded`` field, the same way;
- each ``multipart/form-data`` part, by the ``name`` of its Content-Disposition (raw and
  percent-decoded), and its content walked again by the part's own type (a JSON part);
- each member of a JSON document at any depth, duplicates included (the upstream may read either),
  by its own name, and by its name under its parent's when its own is the tail of a credential
  name (``{"api": {"key": …}}`` is ``api_key``; an array passes its holder's name on); a JSON
  content type that does not parse is searched for ``"name": value`` members instead;
- a body of any other declared type that parses as JSON (``curl -d '{...}'`` sends JSON as a
  form) is walked as JSON too.

A value counts when it is a non-empty string or a number, or an array holding one (at any depth).
An empty value is no credential and passes; so does ``null``, ``true``/``false``, and an object
under a credential name, which is walked for its own members (``"auth": {"type": "oauth"}``).
A run token under such a name is refused like any other value: the upstream never sees one.

Exempt: the query parameter the policy injects (``inject: {query: key}``; it holds the placeholder
and the secret replaces it) by its exact decoded name, and the names a purpose lists in
``allow_fields``. A ``Finding`` names the place and the field, never the value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import unquote, unquote_plus

from gateways.credential_scan import Finding, media_type, percent_decoded
from policies.credential_names import completes_a_name, credential_key
from policies.model import Injection, Placement, Purpose

NAMED = "credential_name"  # the Finding's pattern: found by name, not by shape
MAX_DEPTH = 4  # multipart parts inside multipart parts
MAX_PAIRS = 4096  # (parent, member) name pairs tried before a JSON text is walked instead
_LABEL = re.compile(r"[A-Za-z0-9_.\-\[\]]{1,64}")
_LOOSE_MEMBER = re.compile(rb'"((?:[^"\\\r\n]|\\.){1,256})"\s*:\s*\[?\s*(?:"(?:[^"\\]|\\.)|-?[0-9])')


@dataclass(frozen=True)
class FieldRules:
    """What is exempt for one request: the injected query parameter, the purpose's allowed names."""

    injected_param: str = ""
    allowed: frozenset[str] = frozenset()  # normalised names

    @classmethod
    def of(cls, injection: Injection, purpose: Purpose | None) -> FieldRules:
        param = injection.param if injection.placement is Placement.QUERY else ""
        return cls(param, purpose.allow_fields if purpose is not None else frozenset())

    def refuses(self, names: list[str], flat: bool) -> bool:
        """Is any form of a name credential-named and not allowed?"""
        for name in names:
            key = credential_key(name, flat)
            if key is not None and key not in self.allowed:
                return True
        return False


def label(name: str) -> str:
    """The field name for the audit line when it is a plain short name, else a stand-in."""
    return name if _LABEL.fullmatch(name) else "<redacted>"


def _forms(raw: bytes) -> list[str]:
    return [form.decode("utf-8", "replace") for form in percent_decoded(raw)]


def find_in_query(raw_query: bytes, rules: FieldRules) -> Finding | None:
    return _find_pairs(raw_query, "query", rules)


def _find_pairs(raw: bytes, where: str, rules: FieldRules) -> Finding | None:
    for pair in re.split(rb"[&;]", raw):
        name, _, value = pair.partition(b"=")
        if not value:
            continue
        once = unquote_plus(name.decode("latin-1"))  # as parse_qsl reads it (credentials.inject)
        if where == "query" and rules.injected_param and once == rules.injected_param:
            continue
        forms = _forms(name)
        if rules.refuses(forms, flat=True):
            return Finding(f"{where}:{label(forms[-1])}", NAMED)
    return None


def find_in_body(body: bytes, content_type: str, rules: FieldRules, depth: int = 0) -> Finding | None:
    """The first credential-named field of ``body`` read as ``content_type`` (and as JSON if it
    parses as JSON whatever its type)."""
    if not body:
        return None
    kind = media_type(content_type)
    if kind == "application/json" or kind.endswith("+json"):
        return _find_json(body, "body:json", rules, strict=True)
    finding = None
    if kind == "application/x-www-form-urlencoded":
        finding = _find_pairs(body, "body:form", rules)
    elif kind.startswith("multipart/"):
        finding = _find_multipart(body, content_type, rules, depth)
    if finding is None and _looks_like_json(body):
        # JSON-looking text of another type, parsed or not (a lenient upstream may read it as
        # JSON either way): strict, so what does not parse is still searched for name: value
        finding = _find_json(body, "body:json", rules, strict=True)
    return finding


def _looks_like_json(body: bytes) -> bool:
    """Starts with ``{`` or ``[`` after any byte-order mark and white space (UTF-8/16/32)."""
    head = body[:64].decode(json.detect_encoding(body[:4]), "ignore")
    return head.lstrip("\ufeff \t\r\n")[:1] in ("{", "[")


class _Members(list[tuple[str, object]]):
    """A JSON object as its members in order, duplicates kept."""


def _plain_keys(body: bytes) -> set[bytes] | None:
    """Every member name of a JSON text without escapes (no backslash, UTF-8), or None.

    Without a backslash every ``"`` delimits a string, so splitting on it alternates structure and
    strings, and a string is a member name exactly when the structure after it starts with ``:``.
    One C-speed split instead of a parse: most bodies (chat requests) name no credential at all.
    """
    if b"\\" in body or b"\0" in body:
        return None
    pieces = body.split(b'"')
    if len(pieces) % 2 == 0:
        return None  # an unclosed string: not JSON
    return {pieces[i] for i in range(1, len(pieces) - 1, 2) if pieces[i + 1].lstrip()[:1] == b":"}


def _pairs_could_name(keys: list[str], rules: FieldRules) -> bool:
    """Could some member, under some other as its parent, name a credential (``api``, ``key``)?
    Past ``MAX_PAIRS`` candidate pairs: assume so (the walk is linear, this would not be)."""
    tails = [k for k in keys if completes_a_name(k)]
    if len(tails) * len(keys) > MAX_PAIRS:
        return True
    return any(rules.refuses([f"{parent}_{tail}"], flat=False) for tail in tails for parent in keys)


def _find_json(body: bytes, where: str, rules: FieldRules, strict: bool) -> Finding | None:
    keys = [k.decode("utf-8", "replace") for k in _plain_keys(body) or ()]
    if keys and not rules.refuses(keys, flat=False) and not _pairs_could_name(keys, rules):
        return None  # no member names a credential, alone or under any other: nothing to walk
    try:
        document = json.loads(body, object_pairs_hook=_Members)
    except (ValueError, RecursionError):
        return _find_loose_json(body, where, rules) if strict else None
    # (node, the credential name its array elements are under, the name of the member holding it)
    stack: list[tuple[object, str | None, str]] = [(document, None, "")]
    while stack:
        node, under, parent = stack.pop()
        if isinstance(node, _Members):
            for name, value in node:
                # a member is named by itself, or with its parent: {"api": {"key": …}} is api_key
                named = name if rules.refuses([name], flat=False) else None
                if named is None and parent and completes_a_name(name):
                    combined = f"{parent}_{name}"
                    named = combined if rules.refuses([combined], flat=False) else None
                if named is not None and _is_value(value):
                    return Finding(f"{where}:{label(named)}", NAMED)
                stack.append((value, named if isinstance(value, list) else None, name))
        elif isinstance(node, list):
            for item in node:
                if under is not None and _is_value(item):
                    return Finding(f"{where}:{label(under)}", NAMED)
                stack.append((item, under if isinstance(item, list) else None, parent))
    return None


def _is_value(value: object) -> bool:
    if isinstance(value, str):
        return value != ""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _find_loose_json(body: bytes, where: str, rules: FieldRules) -> Finding | None:
    """JSON that does not parse may still parse upstream: every ``"name": "x…"``, ``"name": 1`` or
    ``"name": ["x…"``."""
    for match in _LOOSE_MEMBER.finditer(body):
        raw = match.group(1)
        try:
            name = json.loads(b'"' + raw + b'"')
        except ValueError:
            name = raw.decode("utf-8", "replace")
        if rules.refuses([name], flat=False):
            return Finding(f"{where}:{label(name)}", NAMED)
    return None


_HEADER = re.compile(rb"^([A-Za-z0-9-]+)[ \t]*:(.*)$", re.M)
_PARAM = re.compile(r';\s*([^=\s;]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;]*)')


def _params(value: str, wanted: str) -> list[str]:
    """Every value of parameter ``wanted`` in ``form-data; name="a"; name*=utf-8''%61``, quotes
    and RFC 2231 encoding undone: ``name`` and ``name*`` both (an upstream may read either)."""
    out: list[str] = []
    for key, raw in _PARAM.findall(value):
        key, raw = key.lower(), raw.strip()
        if key.rstrip("*") != wanted:
            continue
        if raw.startswith('"') and raw.endswith('"') and len(raw) >= 2:
            raw = re.sub(r"\\(.)", r"\1", raw[1:-1])
        if key.endswith("*"):
            charset, _, rest = raw.partition("'")
            raw = unquote(rest.partition("'")[2], encoding=charset or "utf-8", errors="replace")
        out.append(raw)
    return out


def _parts(body: bytes, boundary: str) -> Iterator[tuple[dict[str, list[str]], bytes]]:
    """(lower-cased headers, content) of each part between ``--boundary`` delimiters. A regex
    per part head, not the email parser: a 16 MiB body may hold hundreds of thousands of parts."""
    for chunk in body.split(b"--" + boundary.encode("latin-1"))[1:]:
        if chunk.startswith(b"--"):
            return  # the close delimiter
        head, sep, content = chunk.partition(b"\r\n\r\n")
        if not sep:
            head, _, content = chunk.partition(b"\n\n")
        headers: dict[str, list[str]] = {}
        for name, value in _HEADER.findall(head):
            headers.setdefault(name.decode("latin-1").lower(), []).append(value.decode("latin-1").strip())
        yield headers, content.removesuffix(b"\n").removesuffix(b"\r")


def _find_multipart(body: bytes, content_type: str, rules: FieldRules, depth: int) -> Finding | None:
    if depth >= MAX_DEPTH:
        return None
    # every boundary the type names, and every Content-Disposition and Content-Type of a part:
    # parsers differ on which one wins (Starlette takes the last header, others the first)
    for boundary in dict.fromkeys(b for b in _params(content_type, "boundary") if b):
        for headers, content in _parts(body, boundary):
            for disposition in headers.get("content-disposition", []):
                for name in _params(disposition, "name"):
                    forms = _forms(name.encode("utf-8", "surrogateescape"))
                    if content and rules.refuses(forms, flat=True):
                        return Finding(f"body:multipart:{label(forms[-1])}", NAMED)
            for inner_type in headers.get("content-type", []) or [""]:
                inner = find_in_body(content, inner_type, rules, depth + 1)
                if inner is not None:
                    return Finding(f"body:multipart:{inner.location.removeprefix('body:')}", NAMED)
    return None
