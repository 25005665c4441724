"""Validation of the ``kind: alerts`` document and of an upstream's ``run_limits``.

    version: 1
    kind: alerts
    webhook: {url: https://oncall.example/hooks/valetkey}     # optional; signed with a key from env
    thresholds:                                               # each optional; defaults below
      denial_burst: {count: 10, window: 1m}     # denials by one run
      probing: {count: 5, window: 5m}           # distinct denied method+path of one run
      credential_passthrough: {count: 1, window: 1h}
      secret_echoed: {count: 1, window: 1h}     # responses in which a secret was redacted
      budget_exhausted: {count: 1, window: 1h}
    auto_revoke: [credential_passthrough, denial_burst]       # alerts that also revoke the run
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from policies.model import DEFAULT_RUN_CONCURRENCY, Alerting, AlertKind, RunLimits, Threshold
from policies.report import Report
from policies.units import parse_duration, parse_size

_KINDS = ", ".join(k.value for k in AlertKind)
MAX_RUN_CONCURRENCY = 100_000


def run_limits(value: Any, rule: str, r: Report) -> RunLimits | None:
    if not isinstance(value, dict):
        r.add(rule, "expected a mapping",
              "write e.g. `run_limits: {requests: 500, bytes_out: 50MiB, concurrent: 16}`")
        return None
    unknown = set(value) - {"requests", "bytes_out", "concurrent"}
    if unknown:
        r.add(rule, f"unknown keys {sorted(map(str, unknown))}", "use requests, bytes_out and concurrent")
        return None
    requests = value.get("requests")
    if requests is not None and not _whole(requests, 1):
        r.add(f"{rule} requests", f"{requests!r} is not a positive whole number",
              "write e.g. `requests: 500`")
        return None
    concurrent = value.get("concurrent", DEFAULT_RUN_CONCURRENCY)
    if not _whole(concurrent, 1, MAX_RUN_CONCURRENCY):
        r.add(f"{rule} concurrent", f"{concurrent!r} is not a whole number from 1 to {MAX_RUN_CONCURRENCY}",
              f"write e.g. `concurrent: {DEFAULT_RUN_CONCURRENCY}` (requests of one run in flight at once)")
        return None
    try:
        bytes_out = parse_size(value["bytes_out"]) if "bytes_out" in value else None
    except ValueError as exc:
        r.add(f"{rule} bytes_out", str(exc), "write e.g. `bytes_out: 50MiB`")
        return None
    return RunLimits(requests=requests, bytes_out=bytes_out, concurrent=concurrent)


def _whole(value: Any, low: int, high: int | None = None) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool) and value >= low
            and (high is None or value <= high))


def alerts(doc: dict[str, Any], r: Report) -> Alerting | None:
    rule = "alerts"
    unknown = set(doc) - {"version", "kind", "name", "description", "webhook", "thresholds", "auto_revoke"}
    if unknown:
        r.add(rule, f"unknown keys {sorted(map(str, unknown))}",
              "allowed: webhook, thresholds, auto_revoke, name, description")
        return None
    defaults = Alerting()
    thresholds = dict(defaults.thresholds)
    raw = doc.get("thresholds", {})
    if not isinstance(raw, dict):
        r.add(f"{rule} thresholds", "expected a mapping", f"name any of: {_KINDS}")
        return None
    for name, spec in raw.items():
        kind = _kind(name, f"{rule} thresholds", r)
        threshold = _threshold(spec, f"{rule} thresholds {name}", r)
        if kind is None or threshold is None:
            return None
        thresholds[kind] = threshold
    auto = doc.get("auto_revoke", [k.value for k in defaults.auto_revoke])
    if not isinstance(auto, list):
        r.add(f"{rule} auto_revoke", "expected a list of alert names", f"use any of: {_KINDS}")
        return None
    kinds = [_kind(name, f"{rule} auto_revoke", r) for name in auto]
    url = _webhook(doc.get("webhook"), f"{rule} webhook", r)
    if None in kinds or url is None:
        return None
    return Alerting(thresholds=MappingProxyType(thresholds),
                    auto_revoke=frozenset(k for k in kinds if k is not None), webhook_url=url, source=r.file)


def _kind(name: Any, rule: str, r: Report) -> AlertKind | None:
    try:
        return AlertKind(name)
    except ValueError:
        r.add(rule, f"unknown alert {name!r}", f"use one of: {_KINDS}")
        return None


def _threshold(spec: Any, rule: str, r: Report) -> Threshold | None:
    if not isinstance(spec, dict) or set(spec) != {"count", "window"}:
        r.add(rule, "expected {count, window}", "write e.g. `{count: 10, window: 1m}`")
        return None
    count = spec["count"]
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        r.add(rule, f"count {count!r} is not a positive whole number", "write e.g. `count: 10`")
        return None
    try:
        window = parse_duration(spec["window"])
    except ValueError as exc:
        r.add(rule, str(exc), "write e.g. `window: 1m`")
        return None
    return Threshold(count, window)


def _webhook(value: Any, rule: str, r: Report) -> str | None:
    if value is None:
        return ""
    if not isinstance(value, dict) or set(value) != {"url"} or not isinstance(value["url"], str):
        r.add(rule, "expected {url: ...}", "write `webhook: {url: https://...}`")
        return None
    parts = urlsplit(value["url"])
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        r.add(rule, f"{value['url']!r} is not an http(s) URL without credentials",
              "give the receiver's URL; the signing key comes from VALETKEY_ALERT_WEBHOOK_SECRET")
        return None
    return str(value["url"])
