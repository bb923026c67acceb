"""TLS and mutual TLS for the gRPC and HTTP ports, from Triton's flags.

gRPC: ``--grpc-use-ssl``, ``--grpc-use-ssl-mutual`` (implies the former),
``--grpc-server-cert``, ``--grpc-server-key``, ``--grpc-root-cert`` (PEM
files). Triton's HTTP server has no TLS; inferd's takes the same five flags
with ``http`` in place of ``grpc``. With mutual TLS a client must present a
certificate signed by the root certificate; without it, the root certificate
is not needed. The metrics port stays plain HTTP, as Triton's.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The PEM files one port serves TLS with; ``mutual``: clients must present a certificate."""

    cert: Path
    key: Path
    root: Path | None = None
    mutual: bool = False

    def read(self, what: str) -> tuple[bytes, bytes, bytes | None]:
        """(key, certificate chain, root certificates); SystemExit naming the file when one cannot be read."""
        def load(label: str, path: Path) -> bytes:
            try:
                return Path(path).read_bytes()
            except OSError as exc:
                raise SystemExit(f"cannot read the {what} TLS {label} {path}: {exc.strerror}") from None

        root = load("root certificate", self.root) if self.root is not None else None
        return load("key", self.key), load("certificate", self.cert), root

    def to_plain(self) -> dict[str, Any]:
        """As plain data (a frontend worker's configuration travels as msgpack)."""
        return {"cert": str(self.cert), "key": str(self.key), "root": None if self.root is None else str(self.root),
                "mutual": self.mutual}

    @classmethod
    def from_plain(cls, doc: dict[str, Any] | None) -> "TlsFiles | None":
        if not doc:
            return None
        return cls(Path(doc["cert"]), Path(doc["key"]), None if doc["root"] is None else Path(doc["root"]),
                   bool(doc["mutual"]))

    def grpc_credentials(self) -> Any:
        import grpc

        key, cert, root = self.read("gRPC")
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=root,
                                           require_client_auth=self.mutual)

    def uvicorn_options(self) -> dict[str, Any]:
        """uvicorn.Config's TLS arguments (checked by loading them once here)."""
        options: dict[str, Any] = {"ssl_certfile": str(self.cert), "ssl_keyfile": str(self.key)}
        if self.root is not None:
            options["ssl_ca_certs"] = str(self.root)
        if self.mutual:
            options["ssl_cert_reqs"] = ssl.CERT_REQUIRED
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(self.cert, self.key)
            if self.root is not None:
                context.load_verify_locations(self.root)
        except (OSError, ssl.SSLError) as exc:
            raise SystemExit(f"cannot load the HTTP TLS certificate {self.cert} / key {self.key}"
                             f"{f' / root {self.root}' if self.root else ''}: {exc}") from None
        return options


def tls_from_flags(protocol: str, use_ssl: bool, mutual: bool, cert: Path | None, key: Path | None,
                   root: Path | None) -> TlsFiles | None:
    """The TLS files the ``--<protocol>-*`` flags ask for, None for plain text; ValueError when they do not fit."""
    if not (use_ssl or mutual):
        return None
    flag = f"--{protocol}-use-ssl{'-mutual' if mutual else ''}"
    if cert is None or key is None:
        raise ValueError(f"{flag} needs --{protocol}-server-cert and --{protocol}-server-key")
    if mutual and root is None:
        raise ValueError(f"{flag} needs --{protocol}-root-cert: the CA that signs the clients' certificates")
    return TlsFiles(cert, key, root, mutual)
