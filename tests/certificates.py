"""Certificates for TLS tests, made at test time with the ``openssl`` command line tool.

:func:`make_pki` makes a certificate authority and, signed by it, a server certificate for
``127.0.0.1`` / ``localhost`` and a client certificate (for mutual TLS); EC P-256 keys,
valid for a day. The ``cryptography`` package would do the same in Python, but it is not a
dependency of the project; ``openssl`` is on every machine that runs the suite (a test that
needs it is skipped, saying so, where it is not).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Pki", "make_pki", "openssl_missing"]

_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def openssl_missing() -> str | None:
    """Why certificates cannot be made here (a skip reason), or ``None`` when they can."""
    if shutil.which("openssl") is None:
        return "the openssl command line tool is not installed (needed to make certificates)"
    return None


@dataclass(frozen=True)
class Pki:
    """PEM files of one certificate authority and what it signed."""

    ca: Path
    """The CA's certificate: what a client trusts (``OTEL_EXPORTER_OTLP_CERTIFICATE``)."""
    server_cert: Path
    server_key: Path
    client_cert: Path
    """Signed by the CA for client authentication (``..._CLIENT_CERTIFICATE``)."""
    client_key: Path


def _openssl(*args: str | Path, cwd: Path) -> None:
    proc = subprocess.run(
        ["openssl", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=30
    )
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(map(str, args))} failed:\n{proc.stderr}")


def _signed(folder: Path, name: str, cn: str, extensions: str) -> None:
    """``<name>.pem`` and ``<name>.key``: a certificate for ``cn`` signed by the CA whose
    ``ca.pem`` / ``ca.key`` are in ``folder``."""
    (folder / f"{name}.ext").write_text(extensions)
    _openssl("req", *_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
             f"/CN={cn}", cwd=folder)  # fmt: skip
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "1", "-out", f"{name}.pem", "-extfile",
             f"{name}.ext", cwd=folder)  # fmt: skip


def make_pki(folder: Path, name: str = "otel-tunix test CA") -> Pki:
    """A new CA named ``name`` in ``folder`` (created), with a server certificate for
    ``127.0.0.1`` and ``localhost`` and a client certificate, both signed by it."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", *_KEY, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=folder)  # fmt: skip
    _signed(folder, "server", "127.0.0.1",
            "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
            "extendedKeyUsage=serverAuth\n")  # fmt: skip
    _signed(folder, "client", "otel-tunix test client",
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")  # fmt: skip
    return Pki(
        ca=folder / "ca.pem",
        server_cert=folder / "server.pem",
        server_key=folder / "server.key",
        client_cert=folder / "client.pem",
        client_key=folder / "client.key",
    )
