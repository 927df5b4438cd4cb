"""SSRF corpus S52 and the pinned TLS path: the connection goes to the validated IP, yet the certificate is
checked against the host name from the URL (SNI + hostname verification). A self-signed certificate, or one
for another name, fails — pinning never weakens TLS."""

from __future__ import annotations

import datetime as dt
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from aivedio_engine.config import FetchSettings
from aivedio_engine.fetch import Fetcher, FetchError, FetchPolicy, StaticResolver

HOST = "video.cdn.provider.example"
BODY = b"\x00\x00\x00\x18ftypmp42" + b"x" * 1000


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@dataclass
class Pki:
    ca_file: Path
    good: tuple[Path, Path]  # cert, key for HOST signed by the CA
    other_name: tuple[Path, Path]  # signed by the CA, for another host
    self_signed: tuple[Path, Path]  # for HOST, signed by itself


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "aivedio test CA")])
    ca = _cert("aivedio test CA", ca_key, ca_name, ca_key, ca=True)
    (d / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))

    def write(name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> tuple[Path, Path]:
        c, k = d / f"{name}.crt", d / f"{name}.key"
        c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        k.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return c, k

    k1, k2, k3 = _key(), _key(), _key()
    return Pki(
        d / "ca.pem",
        write("good", _cert(HOST, k1, ca_name, ca_key, ca=False), k1),
        write("other", _cert("evil.example", k2, ca_name, ca_key, ca=False), k2),
        write("self", _cert(HOST, k3, x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)]), k3, ca=False), k3),
    )


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # http.server's naming
        self.server.hosts.append(self.headers.get("Host"))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def https_server(request: pytest.FixtureRequest, pki: Pki) -> Iterator[ThreadingHTTPServer]:
    cert, key = {"good": pki.good, "other": pki.other_name, "self": pki.self_signed}[request.param]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.hosts = []  # type: ignore[attr-defined]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _fetch(server: ThreadingHTTPServer, verify: str | bool) -> bytes:
    port = server.server_address[1]
    # a loopback origin stands in for the vendor's CDN: the test needs a reachable TLS server
    policy = FetchPolicy(origin_scheme="https", origin_host=HOST, origin_port=port, allow_loopback_origin=True)
    fetcher = Fetcher(
        FetchSettings(connect_timeout_s=2, idle_timeout_s=2, min_bytes_per_s=0),
        StaticResolver({HOST: ["127.0.0.1"]}),
        verify=verify,
    )
    with fetcher.open(f"https://{HOST}:{port}/o.mp4?sig=secret", policy) as download:
        return b"".join(download.chunks())


@pytest.mark.parametrize("https_server", ["good"], indirect=True, ids=["cert for the host, trusted CA"])
def test_pinned_https_verifies_the_name_from_the_url(https_server: ThreadingHTTPServer, pki: Pki) -> None:
    assert _fetch(https_server, str(pki.ca_file)) == BODY
    assert https_server.hosts == [f"{HOST}:{https_server.server_address[1]}"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "https_server", ["other", "self"], indirect=True, ids=["S52 cert for another name", "S52 self-signed cert"]
)
def test_a_certificate_that_does_not_prove_the_host_fails(https_server: ThreadingHTTPServer, pki: Pki) -> None:
    with pytest.raises(FetchError) as info:
        _fetch(https_server, str(pki.ca_file))
    assert info.value.reason == "connect_failed"
    assert "secret" not in str(info.value)  # signed query strings never reach error text (S52 log half)
