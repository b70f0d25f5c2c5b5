"""``herald voices --available`` and ``herald voices download``: Piper's voice catalog.

The catalog is Piper's ``voices.json`` (the one its own downloader and wyoming-piper read):
an object keyed by voice name, each entry with ``language`` (``code``, ``name_english``,
...), ``quality``, ``num_speakers``, ``aliases`` and ``files`` — paths relative to the
catalog's own location, each with ``size_bytes`` and ``md5_digest``. ``voices.catalog_url``
names it; files are fetched from beside it.

A download goes into a ``NAME.onnx.part`` / ``NAME.onnx.json.part`` pair in the voice
directory. An interrupted one is continued from where it stopped (an HTTP Range request)
the next time; a finished file is checked against the catalog's size and MD5, and a
mismatch deletes it. Only when both files are complete and verified are they renamed into
place, the config last: the catalog takes a voice from its ``.onnx.json``, so a broken or
half-done download never looks like a voice. A running herald notices the new voice by
itself (``daemon.voice_watch``).

Synchronous, on the standard library's ``urllib``: this is a command-line tool, one file
at a time, and ``urllib`` also reads ``file://`` catalogs (a mirror on a USB stick).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import os
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path
from typing import IO, Any
from urllib.parse import urljoin

log = logging.getLogger(__name__)

DEFAULT_CATALOG = "https://huggingface.co/rhasspy/piper-voices/resolve/main/voices.json"
TIMEOUT = 30.0  # seconds without a byte before a request is given up (resumable)
BLOCK = 1 << 16  # bytes read at a time
PART = ".part"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


class DownloadError(Exception):
    """A catalog or download problem, phrased as the one line to show the user."""


class UnknownRemoteVoice(DownloadError):
    """The catalog has no voice of that name (bad input, not a failed download)."""


@dataclass(frozen=True)
class RemoteFile:
    path: str  # relative to the catalog's location
    size: int
    md5: str

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class RemoteVoice:
    """One entry of the catalog."""

    name: str
    language: str  # en_US
    language_name: str  # English (United States)
    quality: str
    speakers: int
    aliases: tuple[str, ...]
    model: RemoteFile  # NAME.onnx
    config: RemoteFile  # NAME.onnx.json

    @property
    def size(self) -> int:
        return self.model.size + self.config.size

    def summary(self, installed: bool) -> dict[str, Any]:
        return {"name": self.name, "language": self.language,
                "language_name": self.language_name, "quality": self.quality,
                "speakers": self.speakers, "size_bytes": self.size, "installed": installed}

    @classmethod
    def from_entry(cls, key: str, entry: Any) -> RemoteVoice:
        """Raises ``ValueError`` saying what the entry lacks."""
        if not isinstance(entry, dict):
            raise ValueError("not an object")
        name = str(entry.get("key") or key)
        if not _NAME.match(name):  # it becomes a file name: no paths, no hidden files
            raise ValueError(f"{name!r} is not a voice name")
        files = []
        for path, meta in (entry.get("files") or {}).items():
            files.append(RemoteFile(path, int(meta["size_bytes"]), str(meta["md5_digest"])))
        model = [f for f in files if f.name.endswith(".onnx")]
        config = [f for f in files if f.name.endswith(".onnx.json")]
        if len(model) != 1 or len(config) != 1:
            raise ValueError("needs exactly one .onnx and one .onnx.json file")
        lang = entry.get("language") or {}
        code = str(lang.get("code", "")) if isinstance(lang, dict) else str(lang)
        english = lang.get("name_english", "") if isinstance(lang, dict) else ""
        country = lang.get("country_english", "") if isinstance(lang, dict) else ""
        return cls(name, code, f"{english} ({country})" if country else english,
                   str(entry.get("quality", "")), int(entry.get("num_speakers") or 1),
                   tuple(str(a) for a in entry.get("aliases") or ()), model[0], config[0])


# --------------------------------------------------------------------------- the catalog


def _open(url: str, offset: int = 0) -> Any:
    """The response to a GET of ``url`` (from byte ``offset``); ``DownloadError`` when the
    server can't be reached or answers with an error."""
    request = urllib.request.Request(url, headers={"User-Agent": "herald"})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        return urllib.request.urlopen(request, timeout=TIMEOUT)
    except urllib.error.HTTPError as e:
        raise DownloadError(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError, HTTPException) as e:
        reason = getattr(e, "reason", e)
        raise DownloadError(f"cannot reach {url} ({reason}); check the network connection, "
                            "or set voices.catalog_url to a reachable copy") from None


def fetch_catalog(url: str) -> dict[str, RemoteVoice]:
    """The voices the catalog at ``url`` offers, by name. Entries that don't describe a
    downloadable voice are skipped with a log line."""
    try:
        with _open(url) as response:
            data = json.loads(response.read())
    except (OSError, HTTPException) as e:
        raise DownloadError(f"reading {url} failed ({e}); try again") from None
    except ValueError as e:
        raise DownloadError(f"{url} is not a Piper voices.json ({e})") from None
    if not isinstance(data, dict):
        raise DownloadError(f"{url} is not a Piper voices.json (expected an object of voices)")
    voices = {}
    for key, entry in data.items():
        try:
            voice = RemoteVoice.from_entry(key, entry)
        except (ValueError, KeyError, TypeError) as e:
            log.debug("catalog entry %s skipped: %s", key, e)
            continue
        voices[voice.name] = voice
    return voices


def find(catalog: dict[str, RemoteVoice], name: str) -> RemoteVoice:
    """A voice by name or alias; ``DownloadError`` suggesting close names otherwise."""
    if name in catalog:
        return catalog[name]
    for voice in catalog.values():
        if name in voice.aliases:
            return voice
    close = difflib.get_close_matches(name, list(catalog), n=3)
    hint = f"; did you mean {' or '.join(close)}?" if close else \
        "; `herald voices --available` lists them"
    raise UnknownRemoteVoice(f"the catalog has no voice {name!r}{hint}")


# --------------------------------------------------------------------------- downloads


class Progress:
    """Bytes received: a tqdm bar on a terminal, else a log line at the start and end (a
    journal or a CI log gets lines, not carriage returns)."""

    def __init__(self, label: str, total: int, done: int) -> None:
        self.bar: Any = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, desc=label, unit="B", unit_scale=True,
                            unit_divisor=1024, leave=True)
        elif done:
            log.info("%s: resuming at %s of %s", label, _mb(done), _mb(total))
        else:
            log.info("%s: downloading %s", label, _mb(total))

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _chunks(f: IO[bytes]) -> Iterator[bytes]:
    while block := f.read(BLOCK):
        yield block


def _md5_of(path: Path) -> Any:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        for block in _chunks(f):
            digest.update(block)
    return digest


def _fetch(url: str, part: Path, remote: RemoteFile) -> None:
    """Bring ``part`` to ``remote``'s full size and check its MD5 (``DownloadError``: the
    part stays for a resume if it is good so far, and is deleted if it can't be)."""
    have = part.stat().st_size if part.exists() else 0
    if have > remote.size:  # not the file the catalog describes now
        have = 0
    digest = _md5_of(part) if have else hashlib.md5(usedforsecurity=False)
    if have < remote.size:
        response = _open(url, have)
        with response:
            if have and response.status != 206:  # the server ignored Range: start over
                have, digest = 0, hashlib.md5(usedforsecurity=False)
            progress = Progress(remote.name, remote.size, have)
            try:
                with part.open("ab" if have else "wb") as out:
                    for block in _chunks(response):
                        _write(out, block, part)
                        digest.update(block)
                        have += len(block)
                        progress.update(len(block))
                    out.flush()
                    os.fsync(out.fileno())
            except (OSError, HTTPException) as e:  # the connection broke or stalled
                raise DownloadError(f"{remote.name}: the download was interrupted after "
                                    f"{_mb(have)} of {_mb(remote.size)} ({e or type(e).__name__}); "
                                    "run the same command again to resume") from None
            finally:
                progress.close()
    if have > remote.size:
        part.unlink(missing_ok=True)
        raise DownloadError(f"{remote.name}: the server sent {have} bytes, the catalog says "
                            f"{remote.size}; the file was deleted and nothing was installed")
    if have < remote.size:  # the connection ended early without an error
        raise DownloadError(f"{remote.name}: the download was interrupted after "
                            f"{_mb(have)} of {_mb(remote.size)}; run the same command again "
                            "to resume")
    if digest.hexdigest() != remote.md5.lower():
        part.unlink(missing_ok=True)
        raise DownloadError(f"{remote.name}: checksum mismatch (MD5 {digest.hexdigest()}, the "
                            f"catalog says {remote.md5}); the file was deleted and nothing "
                            "was installed. Run again; if it repeats, the catalog and its "
                            "files disagree")


def _write(out: IO[bytes], block: bytes, part: Path) -> None:
    try:
        out.write(block)
    except OSError as e:  # the disk, not the network: say so, not "interrupted"
        raise DownloadError(f"cannot write {part}: {e.strerror}") from None


def _up_to_date(path: Path, remote: RemoteFile) -> bool:
    return (path.is_file() and path.stat().st_size == remote.size
            and _md5_of(path).hexdigest() == remote.md5.lower())


def download_voice(voice: RemoteVoice, catalog_url: str, directory: Path) -> bool:
    """Install ``voice`` into ``directory``: True if it was downloaded, False if the
    installed files already match the catalog. ``DownloadError`` otherwise; nothing is
    installed then, and what was fetched is kept for the next attempt to continue."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DownloadError(f"cannot create the voice directory {directory}: {e.strerror}"
                            ) from None
    if not os.access(directory, os.W_OK):
        raise DownloadError(f"cannot write into {directory}; run as a user who may (for "
                            "the service: sudo -u herald herald voices download ...)")
    files = [(voice.model, directory / f"{voice.name}.onnx"),
             (voice.config, directory / f"{voice.name}.onnx.json")]
    if all(_up_to_date(dest, f) for f, dest in files):
        return False
    for remote, dest in files:
        _fetch(urljoin(catalog_url, remote.path), dest.with_name(dest.name + PART), remote)
    for _, dest in files:  # the config last: from then on it is a voice
        os.replace(dest.with_name(dest.name + PART), dest)
    return True
