"""The proxy CA: what a generated CA is, and which CA material is refused (never showing the key)."""

from __future__ import annotations

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from contract.ca import (
    CAError,
    CAMaterial,
    generate_ca,
    load_ca,
    material_from_kv,
    signing_slot,
)
from contract.secret import Secret

CA = generate_ca()
OTHER = generate_ca()
P384 = ec.generate_private_key(ec.SECP384R1()).private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()


def test_generated_ca_is_a_p256_leaf_only_ca_without_ip_names() -> None:
    cert, key = load_ca(CA)

    assert isinstance(key.curve, ec.SECP256R1)
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert (basic.critical, basic.value.ca, basic.value.path_length) == (True, True, 0)
    assert cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    constraints = cert.extensions.get_extension_for_class(x509.NameConstraints)
    assert constraints.critical
    assert {str(n.value) for n in constraints.value.excluded_subtrees or []} == {"0.0.0.0/0", "::/0"}
    assert CA.key_pem.reveal().startswith("-----BEGIN PRIVATE KEY-----")
    assert "PRIVATE" not in repr(CA)
    assert "PRIVATE" not in str(CA)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(None, "no string fields cert and key", id="absent"),
        pytest.param({"cert": CA.cert_pem}, "no string fields cert and key", id="no-key"),
        pytest.param({"cert": "junk", "key": CA.key_pem.reveal()}, "no PEM certificate", id="junk-cert"),
        pytest.param({"cert": CA.cert_pem, "key": "junk"}, "not an unencrypted PKCS8", id="junk-key"),
        pytest.param({"cert": CA.cert_pem, "key": OTHER.key_pem.reveal()}, "does not belong",
                     id="key-of-another-ca"),
        pytest.param({"cert": CA.cert_pem + OTHER.cert_pem, "key": CA.key_pem.reveal()},
                     "expected one CA certificate", id="two-certs"),
        pytest.param({"cert": CA.cert_pem, "key": P384}, "not EC P-256", id="p384-key"),
    ],
)
def test_unusable_ca_material_is_refused(data: object, message: str) -> None:
    with pytest.raises(CAError) as info:
        material_from_kv(data)

    assert message in str(info.value)
    assert "PRIVATE KEY" not in str(info.value)


@pytest.mark.parametrize(("slots", "now", "signing"), [
    (None, 0, "valetkey/proxy/ca"),  # a CA from before rotations
    ("garbled", 0, "valetkey/proxy/ca"),
    ({"valetkey/proxy/ca": 0, "valetkey/proxy/ca-next": 100}, 99, "valetkey/proxy/ca"),  # staged
    ({"valetkey/proxy/ca": 0, "valetkey/proxy/ca-next": 100}, 100, "valetkey/proxy/ca-next"),  # active
    ({"valetkey/proxy/ca": 300, "valetkey/proxy/ca-next": 100}, 200, "valetkey/proxy/ca-next"),
    ({"valetkey/proxy/ca": 300, "valetkey/proxy/ca-next": 100}, 300, "valetkey/proxy/ca"),  # back again
    ({"elsewhere/ca": 0}, 10, "valetkey/proxy/ca"),  # a path that is no slot signs nothing
])
def test_signing_slot(slots: object, now: int, signing: str) -> None:
    import json

    if isinstance(slots, dict):
        data = {"slots": json.dumps({k: {"sha256": "x", "active_from": v} for k, v in slots.items()})}
    else:
        data = {"slots": slots} if slots else {}
    assert signing_slot(data, now) == signing

def test_material_round_trips_through_kv_data() -> None:
    assert material_from_kv(CA.kv_data()) == CAMaterial(CA.cert_pem, Secret(CA.key_pem.reveal()))
