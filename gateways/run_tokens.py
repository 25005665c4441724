"""A run token never leaves for an upstream.

A run token (``contract.claims``) is a placeholder: the gateway reads it where the upstream's
policy puts the credential, verifies it and replaces it with the secret. Anywhere else in a
request it would be carried to the upstream as it is: a placeholder of another upstream in a
body, the proxy credential in a query, a token pasted into a header. Whoever receives it holds a
credential of the run for as long as the run lives, so such a request is refused with
``credential_passthrough`` (audited with the place, pattern ``valetkey_run_token``).

Only what would leave is scanned: the headers ``forwarded_headers`` keeps (the placeholder's own
header, ``Authorization``, cookies and the other credential headers never leave and are not
looked at), the query without the injected parameter, the path, and a buffered body, in every
form the credential scanner decodes (percent-encoding, Basic, JSON escapes). Every run token
begins with the same 32 characters (``contract.claims.token_prefix``), so one literal anchors the
scan, other JWTs are not mistaken for ours, and no word boundary is needed: a character glued in
front of a token does not hide it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from contract.claims import token_prefix
from contract.errors import Forbidden, Reason
from gateways.credential_scan import CredentialPattern, CredentialScanner
from gateways.credentials import strip_query_param
from gateways.exchange import Exchange
from policies.model import Placement

if TYPE_CHECKING:
    from gateways.gateway import Gateway

_SEGMENT = "[A-Za-z0-9_-]"
RUN_TOKEN = CredentialPattern(
    "valetkey_run_token", "valetkey", f"{token_prefix()}{_SEGMENT}+\\.{_SEGMENT}{{16,}}\\.{_SEGMENT}{{16,}}")
SCANNER = CredentialScanner((RUN_TOKEN,), bounded=False)  # "x" + token still carries the token


async def refuse_run_tokens(gw: Gateway, ex: Exchange) -> None:
    """No run token in what would leave for the upstream. Reads headers, query, path and a
    buffered body (a streamed one is not read here). Reason: credential_passthrough."""
    injection = gw.upstream.injection
    query = ex.query
    if injection.placement is Placement.QUERY:  # the placeholder's own parameter is replaced, not carried on
        query = strip_query_param(query, injection.param)
    finding = (SCANNER.scan_headers(ex.forwarded(injection)) or SCANNER.scan_query(query)
               or SCANNER.scan_path(bytes(ex.scope.get("raw_path") or b"")))
    if finding is None and isinstance(ex.body, bytes):
        content_type = (ex.header(b"content-type") or [b""])[0].decode("latin-1")
        finding = SCANNER.scan_body(ex.body, content_type)
    if finding is None:
        return
    ex.record.passthrough = finding.location
    if finding.location == "path":
        ex.record.path = "[path withheld: it carried a credential]"
    raise Forbidden(f"a valetkey run token was sent in {finding.location}; a run's tokens are "
                    "placeholders and never leave for an upstream", Reason.CREDENTIAL_PASSTHROUGH)
