"""Problems found in policy documents, and the small checks every document kind shares.

A check records each problem in a ``Report`` (file, rule, message, fix) and returns ``None`` or
``False`` for what it could not build; the loader raises only after every file is read, so one run
shows every error.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    file: str
    rule: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.file}: {self.rule}: {self.message} (fix: {self.fix})"



@dataclass
class Report:
    file: str
    problems: list[Problem]

    def add(self, rule: str, message: str, fix: str) -> None:
        self.problems.append(Problem(self.file, rule, message, fix))


def keys(
    doc: dict[str, Any], rule: str, required: set[str], optional: set[str], r: Report
) -> bool:
    ok = True
    allowed = sorted(required | optional)
    for key in sorted(set(doc) - required - optional, key=str):
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else "remove it; "
        r.add(rule, f"unknown key {key!r}", f"{hint}allowed keys: {allowed}")
        ok = False
    for key in sorted(required - set(doc)):
        r.add(rule, f"missing key {key!r}", f"add `{key}:`")
        ok = False
    return ok


def mapping(value: Any, rule: str, r: Report) -> dict[str, Any] | None:
    if isinstance(value, dict):
        return value
    r.add(rule, f"expected a mapping, got {type(value).__name__}", "write it as `key: value` lines")
    return None


def string(value: Any, rule: str, r: Report, pattern: re.Pattern[str] | None = None) -> str | None:
    if not isinstance(value, str) or not value.strip():
        r.add(rule, f"expected a non-empty string, got {value!r}", "give a string value")
        return None
    if pattern is not None and not pattern.fullmatch(value):
        r.add(rule, f"{value!r} does not match {pattern.pattern}", "rename it to fit the pattern")
        return None
    return value


def label(kind: str, doc: dict[str, Any]) -> str:
    name = doc.get("name")
    return f"{kind} {name if isinstance(name, str) else '?'}"


def description(doc: dict[str, Any], rule: str, r: Report) -> bool:
    if "description" not in doc:
        return True
    return string(doc["description"], f"{rule} description", r) is not None
