"""``herald voices --available`` and ``herald voices download`` against a local catalog.

A real HTTP server on loopback (``voice_server``) serves a Piper-style ``voices.json`` and a
voice made here (a copy of the bundled one under another name), with Range requests and a
connection it can cut part-way; nothing reaches the internet. The command runs as users run
it, a subprocess with its own config file.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import ROOT, free_port, voices_of_default
from herald_process import herald_env
from voice_server import VoiceServer, serve

from daemon.voices.download import DownloadError, download_resource
from tts import VoiceCatalog
from tts.pinyin import RESOURCES
from tts.resources import G2PW, Resource, ResourceFile

NAME = "en_US-copy-medium"
JOE = voices_of_default() / "en_US-joe-medium.onnx"


def herald(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "daemon.cli", "voices", *args,
                           "--config", str(config)], cwd=ROOT, env=herald_env(),
                          capture_output=True, text=True, timeout=120)


def write_config(tmp: Path, catalog_url: str) -> tuple[Path, Path]:
    voices = tmp / "voices"
    config = tmp / "herald.toml"
    config.write_text(f'[voices]\ndirectories = ["{voices}"]\ncatalog_url = "{catalog_url}"\n')
    return config, voices


@pytest.fixture
def catalog(tmp_path: Path):  # type: ignore[no-untyped-def]
    with serve(tmp_path / "www") as server:
        yield server


def publish(server: VoiceServer, name: str = NAME, md5: str | None = None) -> None:
    server.publish(name, JOE, JOE.with_name(JOE.name + ".json"), name[:5], md5=md5)


def installed(voices: Path) -> set[str]:
    return {i.name for i in VoiceCatalog([voices], include_bundled=False).infos()} \
        if any(voices.glob("*.onnx.json")) else set()


def test_available_lists_what_the_catalog_offers(tmp_path: Path, catalog: VoiceServer) -> None:
    publish(catalog)
    publish(catalog, "de_DE-other-low")
    config, _ = write_config(tmp_path, catalog.catalog_url)
    r = herald("--available", config=config)
    assert r.returncode == 0, r.stderr
    assert NAME in r.stdout and "de_DE-other-low" in r.stdout
    r = herald("--available", "--language", "en", "--json", config=config)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["name"] for row in rows] == [NAME]  # the German one filtered out
    size = JOE.stat().st_size + JOE.with_name(JOE.name + ".json").stat().st_size
    assert rows[0] | {"size_bytes": size} == rows[0]
    assert (rows[0]["language"], rows[0]["quality"], rows[0]["installed"]) == (
        "en_US", "medium", False)


def test_download_installs_a_verified_voice(tmp_path: Path, catalog: VoiceServer) -> None:
    publish(catalog)
    config, voices = write_config(tmp_path, catalog.catalog_url)
    r = herald("download", NAME, config=config)
    assert r.returncode == 0, r.stderr
    assert installed(voices) == {NAME}
    assert (voices / f"{NAME}.onnx").read_bytes() == JOE.read_bytes()
    assert not list(voices.glob("*.part"))
    listing = herald("--json", config=config)
    assert NAME in {v["name"] for v in json.loads(listing.stdout)}
    again = herald("download", NAME, config=config)  # up to date: nothing fetched
    assert again.returncode == 0 and "already installed" in again.stdout
    assert [p for p, _ in catalog.requests].count(f"en/en_US/copy/medium/{NAME}.onnx") == 1


def test_checksum_mismatch_is_refused_and_nothing_installed(tmp_path: Path,
                                                            catalog: VoiceServer) -> None:
    publish(catalog, md5="0" * 32)
    config, voices = write_config(tmp_path, catalog.catalog_url)
    r = herald("download", NAME, config=config)
    assert r.returncode == 1
    assert "checksum mismatch" in r.stderr and "nothing was installed" in r.stderr
    assert sorted(p.name for p in voices.iterdir()) == []  # no voice, no part left over
    assert installed(voices) == set()


def test_interrupted_download_resumes_where_it_stopped(tmp_path: Path,
                                                       catalog: VoiceServer) -> None:
    publish(catalog)
    model_path = f"en/en_US/copy/medium/{NAME}.onnx"
    cut = JOE.stat().st_size * 2 // 5
    catalog.cut[model_path] = cut
    config, voices = write_config(tmp_path, catalog.catalog_url)
    first = herald("download", NAME, config=config)
    assert first.returncode == 1
    assert "interrupted" in first.stderr and "run the same command again" in first.stderr
    part = voices / f"{NAME}.onnx.part"
    assert part.stat().st_size == cut
    assert installed(voices) == set()  # half a model is not a voice
    second = herald("download", NAME, config=config)
    assert second.returncode == 0, second.stderr
    model_requests = [rng for p, rng in catalog.requests if p == model_path]
    assert model_requests == [None, f"bytes={cut}-"]  # the rest only
    model = voices / f"{NAME}.onnx"
    assert hashlib.md5(model.read_bytes()).hexdigest() == \
        hashlib.md5(JOE.read_bytes()).hexdigest()
    assert installed(voices) == {NAME} and not part.exists()


def test_unknown_voice_and_offline_catalog_say_what_to_do(tmp_path: Path,
                                                          catalog: VoiceServer) -> None:
    publish(catalog)
    config, voices = write_config(tmp_path, catalog.catalog_url)
    r = herald("download", "en_US-copy-mediun", config=config)
    assert r.returncode == 2
    assert "no voice 'en_US-copy-mediun'" in r.stderr and f"did you mean {NAME}" in r.stderr
    offline, _ = write_config(tmp_path, f"http://127.0.0.1:{free_port()}/voices.json")
    r = herald("download", NAME, config=offline)
    assert r.returncode == 1
    assert "cannot reach" in r.stderr and "check the network" in r.stderr
    r = herald("--available", config=offline)
    assert r.returncode == 1 and "cannot reach" in r.stderr
    assert not voices.exists() or not any(voices.iterdir())


# --- what a voice needs besides its files: g2pW for Chinese pinyin voices --------------------

PINYIN = "zh_CN-pinyin-x_low"


def publish_pinyin(server: VoiceServer, typed_voices: Path) -> None:
    model = typed_voices / f"{PINYIN}.onnx"
    server.publish(PINYIN, model, model.with_name(model.name + ".json"), "zh_CN")


def model_files(typed_voices: Path) -> list[Path]:
    """The test g2pW model's own files (loading it may have left a ``__pycache__`` beside)."""
    return sorted(f for f in (typed_voices / "g2pW").iterdir() if f.is_file())


def g2pw_archive(typed_voices: Path, dest: Path) -> Path:
    """The test g2pW model packed as Piper packs g2pw.tar.gz: its files at the top."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:gz") as tar:
        for f in model_files(typed_voices):
            tar.add(f, arcname=f.name)
    return dest


def test_available_lists_chinese_voices(tmp_path: Path, catalog: VoiceServer,
                                        typed_voices: Path) -> None:
    publish(catalog)
    publish_pinyin(catalog, typed_voices)
    config, _ = write_config(tmp_path, catalog.catalog_url)
    r = herald("--available", "--language", "zh", config=config)
    assert r.returncode == 0, r.stderr
    assert PINYIN in r.stdout and NAME not in r.stdout


def test_g2pw_is_checked_against_the_pinned_checksum(tmp_path: Path, catalog: VoiceServer,
                                                     typed_voices: Path) -> None:
    """A pinyin voice comes with g2pW, from voices.resources_url (here a mirror of Hugging
    Face's layout holding another archive): checked against the SHA-256 herald pins, the
    wrong archive is refused, and neither it nor the voice is installed."""
    publish_pinyin(catalog, typed_voices)
    g2pw_archive(typed_voices, catalog.root / G2PW.files[0].path)
    config, voices = write_config(tmp_path, catalog.catalog_url)
    with config.open("a") as f:
        f.write(f'resources_url = "http://127.0.0.1:{catalog.port}/"\n')
    r = herald("download", PINYIN, config=config)
    assert r.returncode == 1
    assert "g2pw.tar.gz: checksum mismatch" in r.stderr and "nothing was installed" in r.stderr
    assert (G2PW.files[0].path, None) in catalog.requests
    assert installed(voices) == set() and not (voices / "g2pW").exists()


def test_g2pw_already_beside_the_voices_is_used(tmp_path: Path, catalog: VoiceServer,
                                                typed_voices: Path) -> None:
    """g2pW copied into the voice directory by hand (as Piper keeps it) is not fetched
    again, and the downloaded pinyin voice is listed: it can speak."""
    publish_pinyin(catalog, typed_voices)
    config, voices = write_config(tmp_path, catalog.catalog_url)
    for resource in RESOURCES:
        shutil.copytree(typed_voices / resource.directory, voices / resource.directory)
    r = herald("download", PINYIN, config=config)
    assert r.returncode == 0, r.stderr
    assert installed(voices) == {PINYIN}
    assert not [p for p, _ in catalog.requests if "g2pw" in p or "bert" in p]
    listing = herald("--json", config=config)
    assert PINYIN in {v["name"] for v in json.loads(listing.stdout)}


def test_resource_download_resumes_checks_and_installs_whole(tmp_path: Path,
                                                             catalog: VoiceServer,
                                                             typed_voices: Path) -> None:
    archive = g2pw_archive(typed_voices, catalog.root / "mirror" / "g2pw.tar.gz")
    data = archive.read_bytes()
    pinned = ResourceFile("mirror/g2pw.tar.gz", "g2pw.tar.gz",
                          hashlib.sha256(data).hexdigest(), unpack=True)
    resource = Resource("g2pW", "g2pW", (pinned,), G2PW.required)
    voices = tmp_path / "voices"
    voices.mkdir()
    base = f"http://127.0.0.1:{catalog.port}/"
    catalog.cut[pinned.path] = len(data) // 3
    with pytest.raises(DownloadError, match="interrupted.*run the same command again"):
        download_resource(resource, base, voices)
    assert not (voices / "g2pW").exists()  # half an archive installs nothing
    assert download_resource(resource, base, voices)
    ranges = [rng for p, rng in catalog.requests if p == pinned.path]
    assert ranges == [None, f"bytes={len(data) // 3}-"]  # the rest only
    for f in model_files(typed_voices):
        assert (voices / "g2pW" / f.name).read_bytes() == f.read_bytes()
    assert not list(voices.glob("*.part")) and not list(voices.glob(".g2pW*"))
    assert not download_resource(resource, base, voices)  # up to date: nothing fetched
    assert len([p for p, _ in catalog.requests if p == pinned.path]) == 2

    wrong = Resource("g2pW", "g2pW", (ResourceFile(pinned.path, pinned.name, "0" * 64,
                                                   unpack=True),), G2PW.required)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(DownloadError, match="checksum mismatch"):
        download_resource(wrong, base, elsewhere)
    assert list(elsewhere.iterdir()) == []  # nothing installed, nothing left over

    flat = tmp_path / "usb"  # a local directory holding the file under its plain name
    flat.mkdir()
    shutil.copyfile(archive, flat / "g2pw.tar.gz")
    assert download_resource(resource, flat.as_uri() + "/", elsewhere)
    assert G2PW.installed_in(elsewhere)
