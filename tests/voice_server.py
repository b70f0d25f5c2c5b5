"""A local stand-in for Piper's voice catalog: a real HTTP server on loopback serving a
directory, with Range requests (206 Partial Content) as Hugging Face answers them, and a
switch that cuts the connection part-way through a file once, as a dropped network does.
The tests that download voices talk to it; nothing reaches the internet."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_RANGE = re.compile(r"^bytes=(\d+)-$")


@dataclass
class VoiceServer:
    root: Path
    port: int = 0
    cut: dict[str, int] = field(default_factory=dict)  # path -> bytes sent before hanging up
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range)

    @property
    def catalog_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/voices.json"

    def publish(self, name: str, model: Path, config: Path, language: str = "en_US",
                md5: str | None = None) -> None:
        """Offer ``model`` + ``config`` as voice ``name``, laid out as Piper's repository
        is (``en/en_US/NAME/QUALITY/NAME.onnx``), in ``voices.json``. ``md5``: the digest
        the catalog claims for the model (default: the true one)."""
        family, _, rest = name.partition("_")
        quality = name.rsplit("-", 1)[-1]
        base = f"{family}/{language}/{name.split('-')[1]}/{quality}/{name}"
        files = {}
        for src, suffix in ((model, ".onnx"), (config, ".onnx.json")):
            dest = self.root / f"{base}{suffix}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
            digest = hashlib.md5(dest.read_bytes(), usedforsecurity=False).hexdigest()
            files[f"{base}{suffix}"] = {"size_bytes": dest.stat().st_size,
                                        "md5_digest": md5 if md5 and suffix == ".onnx"
                                        else digest}
        index = self.root / "voices.json"
        catalog = json.loads(index.read_text()) if index.exists() else {}
        catalog[name] = {
            "key": name, "name": name.split("-")[1], "quality": quality, "num_speakers": 1,
            "speaker_id_map": {}, "aliases": [], "files": files,
            "language": {"code": language, "family": family, "region": language[-2:],
                         "name_native": "English", "name_english": "English",
                         "country_english": "United States"}}
        index.write_text(json.dumps(catalog))


def _handler(server: VoiceServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            path = self.path.split("?")[0].lstrip("/")
            server.requests.append((path, self.headers.get("Range")))
            file = server.root / path
            if ".." in path or not file.is_file():
                self.send_error(404)
                return
            data = file.read_bytes()
            start = 0
            match = _RANGE.match(self.headers.get("Range") or "")
            if match:
                start = int(match.group(1))
                if start >= len(data):
                    self.send_error(416)
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(data) - start))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            cut = server.cut.pop(path, None)
            if cut is not None:  # part of the file, then the connection goes
                self.wfile.write(data[start:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(data[start:])

    return Handler


@contextmanager
def serve(root: Path) -> Iterator[VoiceServer]:
    vs = VoiceServer(root)
    root.mkdir(parents=True, exist_ok=True)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(vs))
    vs.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield vs
    finally:
        httpd.shutdown()
        httpd.server_close()
