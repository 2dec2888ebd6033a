"""The generated PKI: a CA, a serving certificate for loopback, an admin client in system:masters."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from chunkpilot.devcluster import certs


def _verify_signed_by(cert: x509.Certificate, ca: x509.Certificate) -> None:
    public_key = ca.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    cert.verify_directly_issued_by(ca)


def test_ca_is_a_self_signed_authority() -> None:
    ca = certs.generate_ca().certificate
    assert ca.subject == ca.issuer
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True


def test_serving_cert_covers_loopback_names_and_is_signed_by_the_ca() -> None:
    ca = certs.generate_ca()
    serving = certs.issue_serving_cert(ca).certificate
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    usage = serving.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usage
    _verify_signed_by(serving, ca.certificate)


def test_admin_client_cert_is_in_system_masters() -> None:
    ca = certs.generate_ca()
    client = certs.issue_client_cert(ca).certificate
    subject = client.subject
    assert subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == certs.ADMIN_USER
    assert subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    usage = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usage
    _verify_signed_by(client, ca.certificate)


def test_serving_cert_needs_a_name() -> None:
    with pytest.raises(ValueError, match="names"):
        certs.issue_serving_cert(certs.generate_ca(), names=())


def test_write_pki_writes_matching_private_files(tmp_path: Path) -> None:
    pki = certs.write_pki(tmp_path / "pki")
    assert (pki.admin_key.stat().st_mode & 0o777) == 0o600
    key = serialization.load_pem_private_key(pki.admin_key.read_bytes(), password=None)
    cert = x509.load_pem_x509_certificate(pki.admin_cert.read_bytes())
    assert key.public_key() == cert.public_key()
    sa_key = serialization.load_pem_private_key(pki.service_account_key.read_bytes(), password=None)
    assert isinstance(sa_key, rsa.RSAPrivateKey)
    assert sa_key.public_key() == serialization.load_pem_public_key(
        pki.service_account_public_key.read_bytes()
    )
