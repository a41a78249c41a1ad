"""Azurite, Microsoft's Azure Storage emulator, as a real process on loopback (blob service only).

    with azurite_server(tmp) as server:        # `azurite-blob` on a free port, its data under tmp
        env = server.env()                     # AZURE_STORAGE_CONNECTION_STRING for its one account
        server.address("container/prefix")     # az://devstoreaccount1/container/prefix

Nothing is patched in-process: azure-storage-blob talks HTTP to the emulator (npm install -g
azurite; .ci/run does), so the SDK's retries, block uploads and ranged downloads all run for real.
The server is stopped by its pid.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.moto_server import stop, wait_until_up
from tests.support.ports import free_port

ACCOUNT = "devstoreaccount1"  # Azurite's well-known development account and key (public, in its docs)
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azurite_available() -> bool:
    return shutil.which("azurite-blob") is not None


@dataclass(frozen=True)
class Azurite:
    endpoint: str  # http://127.0.0.1:<port>/devstoreaccount1

    def connection_string(self) -> str:
        return f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};BlobEndpoint={self.endpoint};"

    def env(self) -> dict[str, str]:
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string()}

    def address(self, path: str) -> str:
        return f"az://{ACCOUNT}/{path}"


@contextmanager
def azurite_server(workdir: Path, start_timeout_s: float = 60.0) -> Iterator[Azurite]:
    """Start azurite-blob on a free loopback port with its data in `workdir`; stop it by pid."""
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "azurite.log"
    for _ in range(3):  # the free port can be taken between choosing it and Azurite binding it
        port = free_port()
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                ["azurite-blob", "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(workdir),
                 "--skipApiVersionCheck", "--disableTelemetry", "--silent"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        endpoint = f"http://127.0.0.1:{port}/{ACCOUNT}"
        if wait_until_up(proc, endpoint + "?comp=list", start_timeout_s):
            break
        stop(proc)
    else:
        raise RuntimeError(f"azurite did not start; its log says:\n{log_path.read_text(errors='replace')[-2000:]}")
    try:
        yield Azurite(endpoint)
    finally:
        stop(proc)
