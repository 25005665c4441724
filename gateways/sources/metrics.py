"""Prometheus metrics of the credential sources, on the gateway's own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class SourceMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["upstream", "kind", "result"]
        self.issued = Counter("valetkey_gateway_credential_issued",
                              "Run credentials issued, by result (ok or a reason code)", labels,
                              registry=registry)
        self.refreshed = Counter("valetkey_gateway_credential_refreshed",
                                 "Run credentials refreshed, by result", labels, registry=registry)
        self.revoked = Counter("valetkey_gateway_credential_revoked",
                               "Run credentials revoked, by result", labels, registry=registry)
        self.issue_seconds = Histogram(
            "valetkey_gateway_credential_issue_seconds",
            "Time to issue a run credential, redaction forms included", ["upstream", "kind"],
            registry=registry, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
