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
itself (``daemon.voices.watch``).

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
import shutil
import sys
import tarfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path, PurePosixPath
from typing import IO, Any
from urllib.parse import urljoin, urlparse

from tts.phoneme_types import resources_for
from tts.resources import DEFAULT_BASE_URL, Resource, ResourceFile

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
    path: str  # relative to the catalog's (or the resources') location
    size: int | None  # None: not published; the server's Content-Length stands in
    digest: str  # hex
    algorithm: str = "md5"  # the catalog's; resources are pinned by SHA-256

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
        return (self.model.size or 0) + (self.config.size or 0)

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


def _open(url: str, offset: int = 0, hint: str = "") -> Any:
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
                            f"or {hint or 'set voices.catalog_url to a reachable copy'}"
                            ) from None


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

    def __init__(self, label: str, total: int | None, done: int) -> None:
        self.bar: Any = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, desc=label, unit="B", unit_scale=True,
                            unit_divisor=1024, leave=True)
        elif done:
            log.info("%s: resuming at %s%s", label, _mb(done), _of(total))
        else:
            log.info("%s: downloading%s", label, _of(total).replace(" of", ""))

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


def _digest_of(path: Path, algorithm: str) -> Any:
    digest = hashlib.new(algorithm, usedforsecurity=False)
    with path.open("rb") as f:
        for block in _chunks(f):
            digest.update(block)
    return digest


def _fetch(url: str, part: Path, remote: RemoteFile, hint: str = "") -> None:
    """Bring ``part`` to ``remote``'s full size and check its digest (``DownloadError``: the
    part stays for a resume if it is good so far, and is deleted if it can't be). Without a
    published size, the server's Content-Length stands in for it."""
    size = remote.size
    have = part.stat().st_size if part.exists() else 0
    if size is not None and have > size:  # not the file the catalog describes now
        have = 0
    digest = _digest_of(part, remote.algorithm) if have else _new_digest(remote)
    complete = have == size if size is not None else (
        have > 0 and digest.hexdigest() == remote.digest.lower())
    if not complete:
        response = _open(url, have, hint)
        with response:
            if have and response.status != 206:  # the server ignored Range: start over
                have, digest = 0, _new_digest(remote)
            if size is None:
                length = response.headers.get("Content-Length")
                size = have + int(length) if length and length.isdigit() else None
            progress = Progress(remote.name, size, have)
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
                                    f"{_mb(have)}{_of(size)} ({e or type(e).__name__}); "
                                    "run the same command again to resume") from None
            finally:
                progress.close()
    if size is not None and have > size:
        part.unlink(missing_ok=True)
        raise DownloadError(f"{remote.name}: the server sent {have} bytes, {size} were "
                            "expected; the file was deleted and nothing was installed")
    if size is not None and have < size:  # the connection ended early without an error
        raise DownloadError(f"{remote.name}: the download was interrupted after "
                            f"{_mb(have)}{_of(size)}; run the same command again to resume")
    if digest.hexdigest() != remote.digest.lower():
        part.unlink(missing_ok=True)
        raise DownloadError(f"{remote.name}: checksum mismatch ({remote.algorithm.upper()} "
                            f"{digest.hexdigest()}, expected {remote.digest}); the file was "
                            "deleted and nothing was installed. Run again; if it repeats, the "
                            "source and the checksum herald expects disagree")


def _new_digest(remote: RemoteFile) -> Any:
    return hashlib.new(remote.algorithm, usedforsecurity=False)


def _of(size: int | None) -> str:
    return f" of {_mb(size)}" if size is not None else ""


def _write(out: IO[bytes], block: bytes, part: Path) -> None:
    try:
        out.write(block)
    except OSError as e:  # the disk, not the network: say so, not "interrupted"
        raise DownloadError(f"cannot write {part}: {e.strerror}") from None


def _up_to_date(path: Path, remote: RemoteFile) -> bool:
    return (path.is_file() and path.stat().st_size == remote.size
            and _digest_of(path, remote.algorithm).hexdigest() == remote.digest.lower())


def download_voice(voice: RemoteVoice, catalog_url: str, directory: Path,
                   resources_url: str = DEFAULT_BASE_URL,
                   resource_places: Sequence[Path] = ()) -> bool:
    """Install ``voice`` into ``directory``, with the resources its phonemizer needs
    (``tts.resources``, from ``resources_url``) unless one of ``resource_places`` (or
    ``directory``) has them: True if anything was downloaded, False if all was there.
    ``DownloadError`` otherwise; the voice is not installed then, and what was fetched is
    kept for the next attempt to continue."""
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
    current = all(_up_to_date(dest, f) for f, dest in files)
    if not current:
        for remote, dest in files:
            _fetch(urljoin(catalog_url, remote.path), dest.with_name(dest.name + PART), remote)
    config = files[1][1] if current else files[1][1].with_name(files[1][1].name + PART)
    fetched = False
    places = [directory, *resource_places]
    for resource in resources_for(_phoneme_type(config)):
        if resource.find(places) is None or not _source_matches(resource, directory):
            fetched |= download_resource(resource, resources_url, directory)
    if not current:
        for _, dest in files:  # the config last: from then on it is a voice
            os.replace(dest.with_name(dest.name + PART), dest)
    return fetched or not current


def _phoneme_type(config: Path) -> str:
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
        return str(data.get("phoneme_type", "espeak"))
    except (OSError, ValueError, AttributeError) as e:
        raise DownloadError(f"{config.name} is not a Piper voice config ({e})") from None


# --------------------------------------------------------------------------- resources

SOURCE = ".herald-source"  # in an installed resource: the SHA-256 of what it was made from


def _source_matches(resource: Resource, directory: Path) -> bool:
    """Whether the copy in ``directory`` was made from the files pinned now. A copy
    without the record (put there by hand, or Piper's own) is taken as it is."""
    record = directory / resource.directory / SOURCE
    if not record.is_file():
        return True
    try:
        return bool(json.loads(record.read_text()) == _pins(resource))
    except ValueError:
        return False


def _pins(resource: Resource) -> dict[str, str]:
    return {f.name: f.sha256 for f in resource.files}


def _resource_url(base: str, file: ResourceFile) -> str:
    """Where ``file`` is under ``base``: Hugging Face's path; in a local directory also
    its plain name, for files copied there side by side."""
    url = urljoin(base if base.endswith("/") else base + "/", file.path)
    if url.startswith("file:"):
        local = Path(urllib.request.url2pathname(urlparse(url).path))
        if not local.exists():
            return urljoin(base if base.endswith("/") else base + "/", file.name)
    return url


def download_resource(resource: Resource, base_url: str, directory: Path) -> bool:
    """Install ``resource`` as ``directory / resource.directory``: each file fetched into a
    ``.part`` beside it (resumable), checked against its pinned SHA-256 (and size, when
    pinned), archives unpacked into a staging directory that replaces the installed one in
    one rename once it holds what it must. True if it was installed, False if the
    installed copy was already made from these files. ``DownloadError`` otherwise, with
    nothing installed."""
    target = directory / resource.directory
    if resource.installed_in(directory) and (target / SOURCE).is_file() \
            and _source_matches(resource, directory):
        return False
    hint = ("set voices.resources_url to a reachable mirror of Hugging Face, or to a "
            "directory holding " + ", ".join(f.name for f in resource.files))
    parts = []
    for file in resource.files:
        part = directory / f"{resource.directory}.{file.path.rsplit('/', 1)[-1]}{PART}"
        _fetch(_resource_url(base_url, file), part,
               RemoteFile(file.path, file.size, file.sha256, "sha256"), hint)
        parts.append((file, part))
    staging = directory / f".{resource.directory}.new"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir()
        for file, part in parts:
            if file.unpack:
                _unpack(part, staging)
            else:
                shutil.copyfile(part, staging / file.path.rsplit("/", 1)[-1])
        missing = [name for name in resource.required if not (staging / name).is_file()]
        if missing:
            for _, part in parts:  # checked, yet not what it should be: don't resume it
                part.unlink(missing_ok=True)
            raise DownloadError(f"{resource.title}: the download lacks {', '.join(missing)}; "
                                "nothing was installed")
        (staging / SOURCE).write_text(json.dumps(_pins(resource)))
        _replace_dir(staging, target)
    except OSError as e:
        raise DownloadError(f"cannot install {target}: {e}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for _, part in parts:
        part.unlink(missing_ok=True)
    log.info("%s: installed in %s", resource.title, target)
    return True


def _unpack(archive: Path, into: Path) -> None:
    """A .tar.gz's regular files and directories, none of them outside ``into``."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = tar.getmembers()
            for m in members:
                name = PurePosixPath(m.name)
                if name.is_absolute() or ".." in name.parts or not (m.isfile() or m.isdir()):
                    raise DownloadError(f"{archive.name}: refusing the archive member "
                                        f"{m.name!r} (outside the directory, or not a plain "
                                        "file); nothing was installed")
            if hasattr(tarfile, "data_filter"):
                tar.extractall(into, members, filter="data")
            else:  # Python before 3.11.4: the members were checked above
                tar.extractall(into, members)
    except (tarfile.TarError, EOFError) as e:
        raise DownloadError(f"{archive.name}: not a readable .tar.gz ({e}); nothing was "
                            "installed") from None


def _replace_dir(new: Path, target: Path) -> None:
    """Put ``new`` where ``target`` is, in one rename if ``target`` does not exist yet;
    else the old one steps aside first and is removed after."""
    if not target.exists():
        os.replace(new, target)
        return
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(target, old)
    try:
        os.replace(new, target)
    except OSError:
        os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)
