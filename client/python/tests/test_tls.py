"""TLS, mutual TLS and bearer tokens against a verifyd started with --tls_cert, --tls_key,
--tls_client_ca and --auth_token_file (a throw-away PKI made with the openssl command)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Dict, Iterator

import pytest

import verifyd
from conftest import PROMPT, VerifydProcess, openssl

TOKEN = "alice-token-0123456789abcdef"


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(args, cwd=cwd, check=True, capture_output=True)


def _make_pki(d: Path) -> Dict[str, Path]:
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _run(
        "openssl",
        "req",
        "-x509",
        *ec,
        "-days",
        "2",
        "-subj",
        "/CN=verifyd-test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        cwd=d,
    )
    (d / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name, ext in (("server", ["-extfile", "server.ext"]), ("client", [])):
        _run(
            "openssl",
            "req",
            *ec,
            "-subj",
            f"/CN={name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            cwd=d,
        )
        _run(
            "openssl",
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            *ext,
            cwd=d,
        )
    (d / "tokens").write_text(f"alice {TOKEN}\n")
    names = ("ca.pem", "server.pem", "server.key", "client.pem", "client.key", "tokens")
    return {n: d / n for n in names}


@pytest.fixture(scope="module")
def pki(workdir: Path) -> Dict[str, Path]:
    if openssl() is None:
        pytest.skip("the openssl command is not installed")
    d = workdir / "pki"
    d.mkdir(exist_ok=True)
    return _make_pki(d)


@pytest.fixture(scope="module")
def tls_server(workdir: Path, pki: Dict[str, Path]) -> Iterator[VerifydProcess]:
    args = [
        f"--tls_cert={pki['server.pem']}",
        f"--tls_key={pki['server.key']}",
        f"--tls_client_ca={pki['ca.pem']}",
        f"--auth_token_file={pki['tokens']}",
    ]
    p = VerifydProcess(args, workdir)
    try:
        with _client(p, pki) as c:
            c.wait_until_serving(timeout=30)
        yield p
    finally:
        assert p.stop() == 0, p.log()


def _client(p: VerifydProcess, pki: Dict[str, Path], **kw) -> verifyd.Client:
    opts = dict(
        root_certificates=pki["ca.pem"],
        client_certificate=pki["client.pem"],
        client_key=pki["client.key"].read_bytes(),  # a path or the PEM bytes
        token=TOKEN,
        timeout=10,
        retry=verifyd.NO_RETRY,
    )
    opts.update(kw)
    return verifyd.Client(p.target, **opts)


def test_mtls_and_token(tls_server: VerifydProcess, pki) -> None:
    with _client(tls_server, pki) as c:
        assert c.get_info().model.name == "tiny"
        with c.session(PROMPT) as s:
            s.verify()
            assert s.committed_len == len(PROMPT) + 1


def test_missing_or_wrong_token_is_unauthenticated(tls_server: VerifydProcess, pki) -> None:
    for token in (None, "wrong-token-0123456789abcdef"):
        with _client(tls_server, pki, token=token) as c:
            with pytest.raises(verifyd.Unauthenticated):
                c.get_info()


def test_without_client_certificate_the_handshake_fails(tls_server, pki) -> None:
    with _client(tls_server, pki, client_certificate=None, client_key=None) as c:
        with pytest.raises(verifyd.Unavailable):
            c.get_info()


def test_plaintext_to_a_tls_server_fails(tls_server: VerifydProcess) -> None:
    with verifyd.Client(tls_server.target, timeout=5, retry=verifyd.NO_RETRY) as c:
        with pytest.raises(verifyd.Unavailable):
            c.get_info()


def test_asyncio_client_with_tls(tls_server: VerifydProcess, pki) -> None:
    import asyncio

    async def main() -> None:
        async with verifyd.AsyncClient(
            tls_server.target,
            root_certificates=pki["ca.pem"],
            client_certificate=pki["client.pem"],
            client_key=pki["client.key"],
            token=TOKEN,
        ) as c:
            s = await c.session(PROMPT)
            await s.verify()
            await s.close()

    asyncio.run(main())
