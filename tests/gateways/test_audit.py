"""gateways/audit.py: what the audit line keeps of a request target."""

from __future__ import annotations

import pytest

from gateways.audit import masked_path


@pytest.mark.parametrize(("query", "logged"), [
    pytest.param(b"", "/x", id="no-query"),
    pytest.param(b"a=1&b=2", "/x?a=***&b=***", id="names-kept-values-masked"),
    pytest.param(b"hunter2-internal-key", "/x?***", id="valueless-item-is-all-value"),
    pytest.param(b"page=2&hunter2", "/x?page=***&***", id="valueless-beside-named"),
    pytest.param(b"api%5Fkey=v", "/x?api_key=***", id="encoded-plain-name"),
    pytest.param(b"sk%20live%2Fkey=v", "/x?***", id="name-that-is-not-a-plain-token"),
    pytest.param(b"a=1;b=2", "/x?a=***", id="semicolon-stays-inside-the-value"),
])
def test_masked_path(query: bytes, logged: str) -> None:
    assert masked_path("/x", query) == logged
