"""A Piper voice: its JSON config and its weights, loaded from the ``.onnx`` file into PyTorch.

The ONNX graph is never run. Every weight is an initializer of the graph; most carry their
module path as their name. The rest were renamed by the exporter and are recovered from the
node that consumes them (``/flow/flows.6/enc/in_layers.0/Conv`` -> ``flow.flows.6.enc.
in_layers.0.weight``). Exactly one transform is needed, declared in ``_FOLDED``: the exporter
folded ``exp(-logs)`` of the duration predictor's first affine flow into a constant.

Loading fails loudly on any missing, unexpected or misshaped weight.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import VoiceError
from .onnx_file import read_model, to_array
from .phoneme_types import Phonemizer, check_phoneme_type, phonemizer_for
from .vits import Vits, VitsConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VoiceConfig:
    """What the ``.onnx.json`` says about a voice."""

    sample_rate: int
    quality: str
    language: str  # e.g. "en_US"
    espeak_voice: str
    phoneme_type: str
    phoneme_id_map: Mapping[str, tuple[int, ...]]
    num_speakers: int
    speaker_id_map: Mapping[str, int]
    noise_scale: float
    length_scale: float
    noise_w: float
    vowel_clusters: frozenset[tuple[str, ...]] = field(default_factory=frozenset)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VoiceConfig:
        """Raises ``VoiceError`` for a config that is not a Piper voice's, or whose phoneme
        type herald does not know."""
        try:
            inference = data.get("inference", {})
            lang = data.get("language", {})
            code = lang.get("code") if isinstance(lang, dict) else None
            espeak_voice = data.get("espeak", {}).get("voice", "")
            return cls(
                sample_rate=int(data["audio"]["sample_rate"]),
                quality=str(data["audio"].get("quality", "unknown")),
                language=str(code or espeak_voice),
                espeak_voice=str(espeak_voice),
                phoneme_type=str(data.get("phoneme_type", "espeak")),
                phoneme_id_map={k: tuple(v) for k, v in data["phoneme_id_map"].items()},
                num_speakers=int(data.get("num_speakers", 1)),
                speaker_id_map=dict(data.get("speaker_id_map") or {}),
                noise_scale=float(inference.get("noise_scale", 0.667)),
                length_scale=float(inference.get("length_scale", 1.0)),
                noise_w=float(inference.get("noise_w", 0.8)),
                vowel_clusters=frozenset(tuple(c) for c in (data.get("vowel_clusters") or [])),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise VoiceError(f"voice config is not a Piper voice config: {e!r}") from e

    def __post_init__(self) -> None:
        check_phoneme_type(self.phoneme_type)


@dataclass(frozen=True)
class VoiceInfo:
    """What a listing needs, without loading the weights."""

    name: str
    model_path: Path
    config_path: Path
    config: VoiceConfig

    @property
    def speakers(self) -> list[str]:
        ids = self.config.speaker_id_map
        return sorted(ids, key=lambda s: ids[s])

    def summary(self, default: bool = False) -> dict[str, Any]:
        """What a listing shows of the voice (``herald voices``, ``GET /voices``)."""
        c = self.config
        return {"name": self.name, "language": c.language, "quality": c.quality,
                "sample_rate": c.sample_rate, "speakers": c.num_speakers,
                "speaker_names": self.speakers, "default": default}

    def speaker_id(self, speaker: str | int | None) -> int | None:
        """Resolve a speaker name or number; None for single-speaker voices.

        Needs only the config, so a front can refuse an unknown speaker before anything
        is queued or loaded."""
        if self.config.num_speakers <= 1:
            if speaker not in (None, "", 0, "0"):
                raise VoiceError(f"voice {self.name} has a single speaker; got {speaker!r}")
            return None
        if speaker is None or speaker == "":
            return 0
        if isinstance(speaker, str) and speaker in self.config.speaker_id_map:
            return self.config.speaker_id_map[speaker]
        try:
            sid = int(speaker)
        except ValueError:
            raise VoiceError(
                f"voice {self.name} has no speaker {speaker!r}; "
                f"known: {', '.join(self.speakers) or f'0..{self.config.num_speakers - 1}'}"
            ) from None
        if not 0 <= sid < self.config.num_speakers:
            raise VoiceError(f"voice {self.name} has no speaker {sid}: speakers are "
                             f"0..{self.config.num_speakers - 1}")
        return sid

    @classmethod
    def from_files(cls, model_path: Path, config_path: Path | None = None) -> VoiceInfo:
        config_path = config_path or model_path.with_name(model_path.name + ".json")
        try:
            data = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise VoiceError(f"cannot read voice config {config_path}: {e}") from e
        name = model_path.name.removesuffix(".onnx")
        return cls(name, model_path, config_path, VoiceConfig.from_json(data))


@dataclass
class Voice:
    """A loaded voice, ready for ``tts.stream``: its weights and its phonemizer."""

    info: VoiceInfo
    model: Vits
    phonemizer: Phonemizer

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def config(self) -> VoiceConfig:
        return self.info.config

    @classmethod
    def load(cls, info: VoiceInfo, resource_places: Sequence[Path] = ()) -> Voice:
        """The weights and the phonemizer of the voice's ``phoneme_type``; the resources
        that needs (``tts.resources``) are looked for beside the voice and in
        ``resource_places``. Raises ``VoiceError`` saying what to install if a part is
        missing, before the weights are read."""
        places = list(dict.fromkeys([info.model_path.parent, *resource_places]))
        try:
            phonemizer = phonemizer_for(info.config, places)
        except VoiceError as e:
            raise VoiceError(f"voice {info.name}: {e}") from e
        return cls(info, load_onnx_weights(info.model_path), phonemizer)

    def speaker_id(self, speaker: str | int | None) -> int | None:
        return self.info.speaker_id(speaker)


# --------------------------------------------------------------------------- ONNX -> torch

# Constants the exporter folded out of a parameter: node output name -> (parameter, inverse).
_FOLDED: dict[str, tuple[str, Callable[[np.ndarray], np.ndarray]]] = {
    "/dp/flows.0/Exp_output_0": ("dp.flows.0.logs", lambda v: -np.log(v)),
}

_CONSUMER_SUFFIX = {("Conv", 1): "weight", ("Conv", 2): "bias",
                    ("ConvTranspose", 1): "weight", ("ConvTranspose", 2): "bias",
                    ("Gather", 0): "weight"}


def _module_path(node_name: str) -> str:
    """``/flow/flows.6/enc/in_layers.0/Conv`` -> ``flow.flows.6.enc.in_layers.0``."""
    return ".".join(node_name.strip("/").split("/")[:-1])


def read_onnx(path: Path) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
    """Named weights and the attributes of the convolutions (dilations, strides)."""
    model = read_model(path)
    inits = {i.name: i for i in model.graph.initializer}
    consumers: dict[str, list[tuple[str, int, str]]] = {}
    attrs: dict[str, dict[str, Any]] = {}
    for node in model.graph.node:
        for idx, inp in enumerate(node.input):
            consumers.setdefault(inp, []).append((node.op_type, idx, node.name))
        if node.op_type in ("Conv", "ConvTranspose"):
            attrs[_module_path(node.name)] = {
                a.name: list(a.ints) for a in node.attribute if a.name in ("dilations", "strides")
            }

    weights: dict[str, np.ndarray] = {}
    for name, init in inits.items():
        if name in _FOLDED:
            target, inverse = _FOLDED[name]
            weights[target] = inverse(to_array(init))
            continue
        if re.fullmatch(r"[A-Za-z_][\w.]*", name) and "." in name:
            weights[name] = to_array(init)
            continue
        for op, idx, node_name in consumers.get(name, []):
            suffix = _CONSUMER_SUFFIX.get((op, idx))
            if suffix and node_name.startswith("/"):
                weights[f"{_module_path(node_name)}.{suffix}"] = to_array(init)
                break
    return weights, attrs


def infer_config(w: Mapping[str, np.ndarray], attrs: Mapping[str, dict[str, Any]]) -> VitsConfig:
    """Hyper-parameters from the weights' shapes and the convolutions' attributes."""

    def count(prefix: str) -> int:
        pat = re.compile(re.escape(prefix) + r"(\d+)\.")
        return len({m.group(1) for k in w if (m := pat.match(k))})

    try:
        n_vocab, hidden = w["enc_p.emb.weight"].shape
        rel = w["enc_p.encoder.attn_layers.0.emb_rel_k"].shape
        n_ups = count("dec.ups.")
        n_kernels = count("dec.resblocks.") // n_ups
        rb1 = "dec.resblocks.0.convs1.0.weight" in w
        conv = "convs1" if rb1 else "convs"
        kernel_sizes = tuple(int(w[f"dec.resblocks.{j}.{conv}.0.weight"].shape[2])
                             for j in range(n_kernels))
        dilations = tuple(
            tuple(int(attrs.get(f"dec.resblocks.{j}.{conv}.{i}", {}).get("dilations", [1])[0])
                  for i in range(count(f"dec.resblocks.{j}.{conv}.")))
            for j in range(n_kernels)
        )
        strides = tuple(int(attrs[f"dec.ups.{i}"]["strides"][0]) for i in range(n_ups))
        emb_g = w.get("emb_g.weight")
        use_sdp = "dp.flows.0.m" in w
        return VitsConfig(
            n_vocab=int(n_vocab),
            hidden_channels=int(hidden),
            inter_channels=int(w["enc_p.proj.weight"].shape[0]) // 2,
            filter_channels=int(w["enc_p.encoder.ffn_layers.0.conv_1.weight"].shape[0]),
            n_heads=int(hidden) // int(rel[2]),
            n_layers=count("enc_p.encoder.attn_layers."),
            kernel_size=int(w["enc_p.encoder.ffn_layers.0.conv_1.weight"].shape[2]),
            window_size=(int(rel[1]) - 1) // 2,
            use_sdp=use_sdp,
            dp_filter_channels=256 if use_sdp else int(w["dp.conv_1.weight"].shape[0]),
            flow_layers=count("flow.flows."),
            flow_wn_layers=count("flow.flows.0.enc.in_layers."),
            flow_kernel_size=int(w["flow.flows.0.enc.in_layers.0.weight"].shape[2]),
            resblock="1" if rb1 else "2",
            resblock_kernel_sizes=kernel_sizes,
            resblock_dilation_sizes=dilations,
            upsample_rates=strides,
            upsample_initial_channel=int(w["dec.conv_pre.weight"].shape[0]),
            upsample_kernel_sizes=tuple(int(w[f"dec.ups.{i}.weight"].shape[2])
                                        for i in range(n_ups)),
            n_speakers=int(emb_g.shape[0]) if emb_g is not None else 1,
            gin_channels=int(emb_g.shape[1]) if emb_g is not None else 0,
        )
    except (KeyError, IndexError, ZeroDivisionError) as e:
        raise VoiceError(f"not a VITS voice this loader knows (missing {e})") from e


def load_state(model: Vits, weights: dict[str, np.ndarray], source: str) -> None:
    """Copy every weight into the model; refuse a partial or misshaped load."""
    state = model.state_dict()
    # Piper's export drops parameters that inference never reads; they stay at their init.
    unused = {k for k in state if k.startswith("dp.flows.1.")}
    missing = sorted(k for k in state if k not in weights and k not in unused)
    extra = sorted(k for k in weights if k not in state)
    bad = sorted(f"{k}: file {tuple(v.shape)} != model {tuple(state[k].shape)}"
                 for k, v in weights.items() if k in state and v.shape != state[k].shape)
    if missing or extra or bad:
        parts = []
        for label, items in (("missing", missing), ("unexpected", extra), ("misshaped", bad)):
            if items:
                parts.append(f"{len(items)} {label}: {', '.join(items[:6])}"
                             + (" ..." if len(items) > 6 else ""))
        raise VoiceError(f"{source}: weights do not fit the model ({'; '.join(parts)})")
    count = Counter(k.split(".")[0] for k in weights)
    with torch.no_grad():
        for k in list(weights):
            state[k].copy_(torch.from_numpy(weights.pop(k)).to(state[k].dtype))
    for module in model.modules():
        drop = getattr(module, "drop_cache", None)
        if callable(drop):
            drop()
    log.debug("%s: loaded %d tensors (%s)", source, sum(count.values()), dict(count))


def load_onnx_weights(path: Path) -> Vits:
    weights, attrs = read_onnx(path)
    config = infer_config(weights, attrs)
    model = Vits(config)
    load_state(model, weights, str(path))
    model.eval()
    n = sum(p.numel() for p in model.parameters())
    log.debug("%s: %.1fM parameters, hop %d, context flow %d / generator %d frames",
              path.name, n / 1e6, config.hop_length, model.flow.receptive_field,
              model.dec.receptive_field)
    return model

