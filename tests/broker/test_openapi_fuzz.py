"""The served OpenAPI document is what the broker does: schemathesis against the live broker.

A broker of its own (real uvicorn on loopback, the session's OpenBao, a redis-server of its own so
the revocations the security team's identity is made to write reach no other test), called as a
runtime and as the security team. Every check schemathesis has runs, except
``positive_data_acceptance`` (a schema cannot say which upstreams and purposes exist: policy does)
— so no 5xx, every status and header documented, every body matching its schema, schema-invalid
input refused with 4xx, undocumented methods answered 405 with ``Allow``.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from broker.openapi import OPENAPI
from tests.support.broker_stack import Broker

MAX_EXAMPLES = 25  # per operation and identity: the whole test stays well under a minute


@pytest.fixture(scope="module")
def fuzzed_broker(isolated_broker: Broker) -> str:
    return isolated_broker.url


# the document as the module holds it (the served one is checked to be the same below):
# schemathesis' fixture-loaded schemas do not run under pytest 9.2 (they set Function._nodeid)
schema = schemathesis.openapi.from_dict(OPENAPI)


def test_served_document_is_the_one_fuzzed(fuzzed_broker: str) -> None:
    assert httpx.get(f"{fuzzed_broker}/openapi.json").json() == OPENAPI


# HTTP framing is the server's (uvicorn answers a garbled Content-Length with its own plain 400
# before the application sees the request), not what the document describes
FRAMING = frozenset({"content-length", "transfer-encoding", "host", "connection"})


def app_level(case: Any) -> Any:
    """The generated case without framing headers, which the HTTP server, not the broker, judges."""
    for name in [n for n in (case.headers or {}) if n.lower() in FRAMING]:
        del case.headers[name]
    return case


FUZZ = settings(max_examples=MAX_EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.filter_too_much])


@pytest.mark.slow
@schema.parametrize()
@FUZZ
def test_as_a_runtime(case: Any, fuzzed_broker: str, bootstrapped_vault: Any) -> None:
    token = bootstrapped_vault.runtime_token("coding-agent")
    app_level(case).call_and_validate(base_url=fuzzed_broker, headers={"X-Vault-Token": token},
                           excluded_checks=[positive_data_acceptance])


@pytest.mark.slow
@schema.parametrize()
@FUZZ
def test_as_the_security_team(case: Any, fuzzed_broker: str, bootstrapped_vault: Any) -> None:
    app_level(case).call_and_validate(base_url=fuzzed_broker,
                                      headers={"X-Vault-Token": bootstrapped_vault.admin_token},
                           excluded_checks=[positive_data_acceptance])
