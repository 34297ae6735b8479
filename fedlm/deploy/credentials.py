"""TLS certificates, SuperNode keys, shared secrets and the Control API token of a Flower
deployment, in the formats Flower reads, and the private folder they live in.

``fedlm deploy local`` makes them at start (fedlm.deploy.local); on real machines the same
functions make a CA and a server certificate for the SuperLink's addresses, one key
pair per SuperNode and the owner's token (docs/deployment.md has the commands).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

from fedlm.deploy import home as home_lib

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
    the SuperNode or SuperLink (``--superexec-auth-secret-file``) and its executor read
    the same file, and it refuses ``AcquireTask`` requests not signed with it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(os.urandom(nbytes))
    path.chmod(0o600)
    return path


def make_token(path: Path) -> str:
    """A random bearer token (43 URL-safe characters, 256 bits), written to ``path``
    (mode 0600, created so: never readable by others, not even for a moment)."""
    import secrets

    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # O_EXCL below: a file left by someone else is not reused
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(token + "\n")
    return token


def store_cli_token(flwr_home: Path, address: str, token: str) -> Path:
    """Put ``token`` where the ``flwr`` CLI of ``flwr_home`` takes its Control API
    bearer token from for ``address``: its credential store (``credentials.yaml``,
    mode 0600), as ``flwr login`` leaves it after an OIDC login (1.41, 1.42:
    ``flwr/cli/auth_plugin/oidc_cli_plugin.py``). The refresh token is never
    accepted: the owner token does not expire."""
    import secrets

    from flwr.cli.constant import (ACCESS_TOKEN_STORE_KEY, AUTHN_TYPE_STORE_KEY,
                                   REFRESH_TOKEN_STORE_KEY)
    from flwr.common.constant import AuthnType
    from flwr.supercore.credential_store import FileCredentialStore

    path = flwr_home / "credentials.yaml"
    store = FileCredentialStore(path)  # writes through a 0600 temporary file, renamed
    store.set(AUTHN_TYPE_STORE_KEY % address, AuthnType.OIDC.encode())
    store.set(ACCESS_TOKEN_STORE_KEY % address, token.encode())
    store.set(REFRESH_TOKEN_STORE_KEY % address, secrets.token_urlsafe(32).encode())
    path.chmod(0o600)
    return path


def private_home(home: Path) -> None:
    """Make ``home`` a deployment's home only its owner can enter (0700): it holds the
    deployment's private keys and its Control API token. A folder of another user, a
    shared one (sticky, as /tmp), or one holding files fedlm did not make is refused,
    not taken over (``fedlm.deploy.home``: the marker, what is reused or adopted)."""
    home_lib.prepare(home)
