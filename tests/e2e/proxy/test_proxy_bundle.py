"""The run bundle a proxy deployment hands a sandbox (proxy-spec: "Run request, tokens and bundle").

Everything an unmodified client needs is in it: the proxy with the run's credential in
``HTTPS_PROXY``, an empty ``NO_PROXY``, the CA file and the variables each tool reads for it, the
placeholders — and nothing else that points anywhere (``VALETKEY_EGRESS=proxy`` drops the base URLs).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from cryptography import x509

from tests.e2e.proxy.conftest import every_secret, sandbox_for
from tests.support.proxy_stack import ProxyStack

PROXY_VARS = ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")
# what the issue names, and npm's own (a global npmrc's `cafile` hides NODE_EXTRA_CA_CERTS)
CA_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT",
           "NODE_EXTRA_CA_CERTS", "npm_config_cafile")
SANDBOX_CA_PATH = "/etc/valetkey/ca.pem"


def claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    value: dict[str, Any] = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return value


def test_bundle_names_the_proxy(stack: ProxyStack, tmp_path: Path) -> None:
    bundle, sandbox = sandbox_for(stack, tmp_path, "openai", "github-git", "pypi", "pythonhosted")
    env = bundle["env"]
    host, port = stack.proxy_address

    # the proxy, with the run's proxy token as the password of user `run`
    proxies = {env.get(name) for name in PROXY_VARS}
    assert len(proxies) == 1, proxies
    [proxy] = proxies
    assert proxy is not None
    assert proxy.startswith("http://run:")
    assert proxy.endswith(f"@{host}:{port}")
    token = proxy.removeprefix("http://run:").removesuffix(f"@{host}:{port}")
    assert (env.get("NO_PROXY"), env.get("no_proxy")) == ("", "")
    assert env.get("VALETKEY_PROXY") == stack.proxy_url

    # the proxy token: audience egress, one grant per (name, purpose), spelled name/purpose
    token_claims = claims(token)
    audience = token_claims["aud"]
    assert audience == "egress" or audience == ["egress"]
    purposes = {g["purpose"] for g in token_claims["grants"]}
    assert purposes == {"openai/chat", "openai/list_models", "github-git/clone", "github-git/push",
                        "pypi/install", "pythonhosted/connect"}

    # the CA file and the variables each client reads for it
    assert {env.get(name) for name in CA_VARS} == {SANDBOX_CA_PATH}
    assert set(bundle["files"]) == {SANDBOX_CA_PATH}
    pem = bundle["files"][SANDBOX_CA_PATH].encode()
    certs = x509.load_pem_x509_certificates(pem)
    assert len(certs) >= 2  # the deployment CA, then the trust roots (here the test CA)
    assert certs[0].extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert stack.ca.cert in certs, "the trust roots (VALETKEY_PROXY_TRUST_FILE) are missing"
    assert {sandbox.env[name] for name in CA_VARS} == {str(sandbox.files[SANDBOX_CA_PATH])}

    # placeholders stay; base URLs go (clients use their default hosts through the proxy)
    assert env["OPENAI_API_KEY"]
    assert env["GIT_PASSWORD"]
    assert "OPENAI_BASE_URL" not in env
    assert "GIT_BASE_URL" not in env
    assert not any(secret in json.dumps(bundle) for secret in every_secret(stack))
