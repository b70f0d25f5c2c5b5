"""Files a phonemizer needs besides the voice itself: what they are, where they come from,
how they are checked and where they live once installed.

Piper fetches these the first time a voice speaks (g2pW's model for Chinese ``pinyin``
voices, from Hugging Face, and transformers fetches the BERT tokenizer it reads with). A
daemon must not depend on the network in the middle of an utterance, so herald never
fetches at run time: ``herald voices download`` installs them with the voice that needs
them (checked against the pinned size and SHA-256 here, resumable, atomic), and loading the
voice finds them in a directory named ``Resource.directory`` beside it or in another voice
directory.

Each file's ``path`` is relative to Hugging Face (``DEFAULT_BASE_URL``), so a mirror that
keeps its layout (``https://hf-mirror.com/``) works as the base, and so does a local
directory (``file:///media/usb/``) holding the files under those paths or side by side
under their plain ``name``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

DEFAULT_BASE_URL = "https://huggingface.co/"


@dataclass(frozen=True)
class ResourceFile:
    path: str  # under the base URL (Hugging Face's layout)
    name: str  # its plain name, for a directory that holds the files side by side
    sha256: str
    size: int | None = None  # None: not pinned; the server's Content-Length is checked
    unpack: bool = False  # a .tar.gz whose members make up the resource


@dataclass(frozen=True)
class Resource:
    directory: str  # the installed directory's name, beside the voices
    title: str  # what the user is told it is
    files: tuple[ResourceFile, ...]
    required: tuple[str, ...]  # what an installed directory must hold

    def installed_in(self, directory: Path) -> bool:
        place = directory / self.directory
        return all((place / name).is_file() for name in self.required)

    def find(self, places: Iterable[Path]) -> Path | None:
        """The installed copy in the first of ``places`` that has one."""
        for place in places:
            if self.installed_in(place):
                return place / self.directory
        return None


# g2pW (Chinese polyphones: 银行 yin2 hang2) as Piper's Chinese phonemizer downloads it.
# The SHA-256 is the one Piper pins for this archive; its size is not published.
G2PW = Resource(
    directory="g2pW",
    title="g2pW, the Chinese polyphone model (about 113 MB, 150 MB unpacked)",
    files=(ResourceFile(
        path="datasets/rhasspy/piper-checkpoints/resolve/main/zh/zh_CN/_resources/g2pw.tar.gz",
        name="g2pw.tar.gz",
        sha256="9137f37d8e15ab1fd04a448bfe9805e00c94db833786735f672d63a44fddc8dd",
        unpack=True),),
    required=("g2pw.onnx", "config.py", "POLYPHONIC_CHARS.txt", "MONOPHONIC_CHARS.txt"),
)

# The tokenizer g2pW reads its input with (its config's ``model_source``, which transformers
# would fetch from Hugging Face at run time), at a pinned revision.
_BERT = "google-bert/bert-base-chinese/resolve/8f23c25b06e129b6c986331a13d8d025a92cf0ea"
BERT_BASE_CHINESE = Resource(
    directory="bert-base-chinese",
    title="the bert-base-chinese tokenizer g2pW reads with (about 110 kB)",
    files=tuple(ResourceFile(f"{_BERT}/{name}", f"bert-base-chinese/{name}", sha256)
                for name, sha256 in (
                    ("vocab.txt",
                     "45bbac6b341c319adc98a532532882e91a9cefc0329aa57bac9ae761c27b291c"),
                    ("tokenizer_config.json",
                     "0f6d13e6f4da6f9e24f22ada6bc3be571123d858d7c0c05a8a7cd55a9c23c2e8"),
                    ("config.json",
                     "88af762cfb15fa9ce183c84dcbfdc9d635196ba635dfe81f265fdd21d67f4c4c"))),
    required=("vocab.txt", "tokenizer_config.json"),
)
