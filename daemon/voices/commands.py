"""``herald voices`` (installed), ``--available`` and ``download``: what the user sees of
the voices (``daemon.voices.download`` does the fetching and checking)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tts import VoiceCatalog

from ..settings import load_settings
from .download import (
    DownloadError,
    RemoteVoice,
    UnknownRemoteVoice,
    download_voice,
    fetch_catalog,
    find,
)

log = logging.getLogger("herald")


def _print(rows: list[dict[str, Any]], as_json: bool, header: str,
           line: Callable[[dict[str, Any]], str]) -> None:
    if as_json:
        print(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    print(header)
    for row in rows:
        print(line(row))


def installed(catalog: VoiceCatalog, as_json: bool) -> int:
    """List the installed voices (the config's directories, ``--voice-dir``, bundled)."""
    rows = [i.summary(i.name == catalog.default) for i in catalog.infos()]
    _print(rows, as_json, f"{'NAME':32} {'LANGUAGE':9} {'QUALITY':8} {'RATE':>6} {'SPEAKERS':>8}",
           lambda r: f"{r['name']:32} {r['language']:9} {r['quality']:8} {r['sample_rate']:>6} "
           f"{r['speakers']:>8}" + (" (default)" if r["default"] else ""))
    return 0


def _installed_names(args: argparse.Namespace, directories: list[Path]) -> set[str]:
    return {i.name for i in VoiceCatalog([*directories, *args.voice_dir]).infos()}


def available(args: argparse.Namespace) -> int:
    """List the catalog's voices, marking those installed here."""
    voices_settings = load_settings(args.config).voices
    try:
        catalog = fetch_catalog(voices_settings.catalog_url)
    except DownloadError as e:
        print(f"herald voices: {e}", file=sys.stderr)
        return 1
    offered = sorted(catalog.values(), key=lambda v: (v.language, v.name))
    if args.language:
        want = args.language.replace("-", "_").lower()
        offered = [v for v in offered if v.language.lower() == want
                   or v.language.lower().split("_")[0] == want]
    here = _installed_names(args, voices_settings.directories)
    rows = [v.summary(v.name in here) for v in offered]
    _print(rows, args.json, f"{'NAME':36} {'LANGUAGE':9} {'QUALITY':8} {'SPEAKERS':>8} {'SIZE':>9}",
           lambda r: f"{r['name']:36} {r['language']:9} {r['quality']:8} {r['speakers']:>8} "
           f"{r['size_bytes'] / 1e6:>6.1f} MB" + (" (installed)" if r["installed"] else ""))
    if not rows and not args.json:
        print(f"no voice of {args.language!r} in the catalog" if args.language
              else "the catalog lists no voices", file=sys.stderr)
    return 0


def download(args: argparse.Namespace) -> int:
    """Download each named voice; 0 if all are installed, 1 if one failed, 2 bad input."""
    settings = load_settings(args.config).voices
    targets = [*args.voice_dir, *settings.directories]
    if not targets:
        print("herald voices download: no voice directory to download into: set "
              "voices.directories in the config (e.g. [\"/var/lib/herald/voices\"]) or pass "
              "--voice-dir DIR", file=sys.stderr)
        return 2
    directory = targets[0]
    try:
        catalog = fetch_catalog(settings.catalog_url)
        chosen: list[RemoteVoice] = [find(catalog, name) for name in args.names]
    except DownloadError as e:
        print(f"herald voices download: {e}", file=sys.stderr)
        return 2 if isinstance(e, UnknownRemoteVoice) else 1
    failed = 0
    for voice in chosen:
        try:
            fetched = download_voice(voice, settings.catalog_url, directory,
                                     settings.resources_url, targets)
        except DownloadError as e:
            print(f"herald voices download: {e}", file=sys.stderr)
            failed += 1
            continue
        print(f"{voice.name}: {'installed' if fetched else 'already installed'} in "
              f"{directory}")
    return 1 if failed else 0
