"""TLS certificates and SuperNode keys for a Flower deployment, in the formats Flower reads.

``fedlm deploy local`` makes them at start (fedlm.deploy.local); on real machines the same
functions make a CA and a server certificate for the SuperLink's addresses and one key
pair per SuperNode (docs/deployment.md has the commands).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

LOCAL_HOSTS = ("127.0.0.1", "localhost")  # the names the server certificate is valid for


def make_certificates(out: Path, hosts: tuple[str, ...] = LOCAL_HOSTS,
                      days: int = 30) -> dict[str, Path]:
    """A self-signed CA and a server certificate signed by it, valid for ``hosts``.

    Writes ``ca.crt``, ``ca.key``, ``server.pem`` and ``server.key`` into ``out``
    and returns their paths. The server certificate carries every host as a
    subjectAltName (IP or DNS entry): TLS clients check the address they dial
    against the SAN, not the common name.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    not_before, not_after = now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedlm local CA")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256()))

    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256()))

    def pem_key(k) -> bytes:
        return k.private_bytes(serialization.Encoding.PEM,
                               serialization.PrivateFormat.TraditionalOpenSSL,
                               serialization.NoEncryption())

    paths = {"ca": out / "ca.crt", "ca_key": out / "ca.key",
             "cert": out / "server.pem", "key": out / "server.key"}
    paths["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    for name, k in (("ca_key", ca_key), ("key", key)):
        paths[name].write_bytes(pem_key(k))
        paths[name].chmod(0o600)
    return paths


def make_node_key(path: Path) -> tuple[Path, Path]:
    """An EC P-384 key pair for SuperNode authentication, in the formats Flower reads.

    Flower (1.41, 1.42) loads the SuperNode's private key with ``load_ssh_private_key``
    (OpenSSH format, unencrypted) and ``flwr supernode register`` takes the
    public key in OpenSSH format (``ecdsa-sha2-nistp384 AAAA...``) on a NIST
    curve — what ``ssh-keygen -t ecdsa -b 384 -N "" -f PATH`` writes. Returns
    (private key path, public key path = PATH.pub).
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path.parent.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.OpenSSH,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
    pub = path.with_name(path.name + ".pub")
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                  serialization.PublicFormat.OpenSSH)
                    + b" fedlm-" + path.stem.encode() + b"\n")
    return path, pub


def make_secret(path: Path, nbytes: int = 32) -> Path:
    """A random shared secret (raw bytes, mode 0600) for SuperExec authentication:
    the SuperNode (``--superexec-auth-secret-file``) and its executor read the same
    file, and the SuperNode refuses ``AcquireTask`` requests not signed with it."""
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(os.urandom(nbytes))
    path.chmod(0o600)
    return path
