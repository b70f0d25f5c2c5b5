"""Small Piper voices of every phoneme type, and a small g2pW, made here: real Chinese,
Japanese, Hebrew and Thai voices and g2pW's model cannot be downloaded in the tests.

* The voice model is Piper's own (``piper.train.vits.models.SynthesizerTrn``, x_low's
  widths with two text encoder layers, random weights) exported as Piper's ``export_onnx``
  exports it (the TorchScript exporter, opset 15, the same inputs and outputs), so
  onnxruntime runs it through
  ``PiperVoice`` and herald loads its weights. The one difference from the voices Piper
  published, which were exported by torch 2.0: that exporter folded the duration
  predictor's ``exp(-logs)`` into a constant and today's does not, so it is folded here.
  Every weight is nudged off its initial value first, because the exporter keeps one copy
  of identical tensors (a fresh LayerNorm's ones), which no trained voice has.
* One such model serves every type: a voice's type is in its ``.onnx.json`` (phoneme type,
  id map, espeak voice, language), and herald and piper-tts each read it from there.
* g2pW's model is g2pW's own module (``g2pw.module.G2PW``, BERT + conditional softmax) at a
  tiny size with random weights, exported with the six inputs piper-tts's converter feeds.
  Its polyphone list holds the corpus's polyphonic characters (and a few hundred more), its
  vocabulary the characters of g2pW's own table; the lookup tables are the ``g2pw``
  package's, as for the real model. Its readings are random, but every one goes through
  the real loading, tokenizing, windowing and inference code.
"""

from __future__ import annotations

import json
import shutil
import string
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16000


@dataclass(frozen=True)
class VoiceType:
    phoneme_type: str
    name: str
    language: str
    espeak_voice: str


TYPES = {
    "pinyin": VoiceType("pinyin", "zh_CN-pinyin-x_low", "zh_CN", "cmn"),
    "japanese": VoiceType("japanese", "ja_JP-test-x_low", "ja_JP", "ja"),
    "hebrew": VoiceType("hebrew", "he_IL-test-x_low", "he_IL", "he"),
    "thai": VoiceType("thai", "th_TH-test-x_low", "th_TH", "th"),
    "text": VoiceType("text", "xx_XX-text-x_low", "xx_XX", ""),
    "espeak": VoiceType("espeak", "ar_JO-test-x_low", "ar_JO", "ar"),
}


def export_runnable(path: Path, seed: int = 0) -> None:
    """A small random Piper voice model, exported as Piper exports one (module docstring)."""
    import onnx
    import torch
    from onnx import numpy_helper
    from piper.train.vits.models import SynthesizerTrn

    torch.manual_seed(seed)
    model = SynthesizerTrn(
        n_vocab=256, spec_channels=513, segment_size=32, inter_channels=96,
        hidden_channels=96, filter_channels=384, n_heads=2, n_layers=2, kernel_size=3,
        p_dropout=0.0, resblock="2", resblock_kernel_sizes=(3, 5, 7),
        resblock_dilation_sizes=((1, 2), (2, 6), (3, 12)), upsample_rates=(8, 8, 4),
        upsample_initial_channel=256, upsample_kernel_sizes=(16, 16, 8)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
        model.dec.remove_weight_norm()

    def infer(text: torch.Tensor, lengths: torch.Tensor, scales: torch.Tensor,
              sid: torch.Tensor | None = None) -> torch.Tensor:
        audio: torch.Tensor = model.infer(text, lengths, noise_scale=scales[0],
                                          length_scale=scales[1], noise_scale_w=scales[2],
                                          sid=sid)[0]
        return audio.unsqueeze(1)

    model.forward = infer  # type: ignore[method-assign]
    ids = torch.randint(0, 256, (1, 50))
    torch.onnx.export(
        model, (ids, torch.LongTensor([50]), torch.FloatTensor([0.667, 1.0, 0.8]), None),
        str(path), dynamo=False, opset_version=15,
        input_names=["input", "input_lengths", "scales", "sid"], output_names=["output"],
        dynamic_axes={"input": {0: "batch_size", 1: "phonemes"},
                      "input_lengths": {0: "batch_size"},
                      "output": {0: "batch_size", 2: "time"}})
    graph = onnx.load(str(path))
    inits = {i.name: i for i in graph.graph.initializer}
    for node in list(graph.graph.node):
        if node.name == "/dp/flows.0/Exp":  # fold exp(-logs) as torch 2.0 did
            source = inits[node.input[0]]
            value = np.exp(numpy_helper.to_array(source))
            graph.graph.initializer.remove(source)
            graph.graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
            graph.graph.node.remove(node)
    onnx.save(graph, str(path))


def voice_config(kind: VoiceType) -> dict[str, object]:
    from piper.phoneme_ids import DEFAULT_PHONEME_ID_MAP
    from piper.phonemize_chinese import PHONEME_TO_ID

    id_map = PHONEME_TO_ID if kind.phoneme_type == "pinyin" else DEFAULT_PHONEME_ID_MAP
    family, region = kind.language.split("_")
    return {
        "audio": {"sample_rate": SAMPLE_RATE, "quality": "x_low"},
        "espeak": {"voice": kind.espeak_voice},
        "inference": {"noise_scale": 0.667, "length_scale": 1, "noise_w": 0.8},
        "phoneme_type": kind.phoneme_type, "phoneme_id_map": id_map,
        "num_symbols": 256, "num_speakers": 1, "speaker_id_map": {},
        "piper_version": "1.8.0",
        "language": {"code": kind.language, "family": family, "region": region},
    }


def install_voice(directory: Path, model: Path, kind: VoiceType) -> Path:
    """``kind``'s voice in ``directory`` (the model copied); its ``.onnx`` path."""
    directory.mkdir(parents=True, exist_ok=True)
    onnx_path = directory / f"{kind.name}.onnx"
    shutil.copyfile(model, onnx_path)
    onnx_path.with_name(onnx_path.name + ".json").write_text(
        json.dumps(voice_config(kind), ensure_ascii=False))
    return onnx_path


def make_g2pw(directory: Path, corpus: str, seed: int = 0, extra_polyphones: int = 250
              ) -> None:
    """g2pW's model and tokenizer as ``herald voices download`` installs them:
    ``directory/g2pW`` (model, config, polyphone lists) and ``directory/bert-base-chinese``
    (vocabulary). Its config names the tokenizer by path, so piper-tts's own phonemizer,
    the reference, finds it without the network too."""
    import g2pw
    import torch
    from g2pw.module import G2PW
    from transformers import BertConfig

    tables = Path(g2pw.__file__).parent
    readings: dict[str, list[str]] = json.loads(
        (tables / "char_bopomofo_dict.json").read_text(encoding="utf-8"))
    s2t = dict(line.split("\t") for line in
               (tables / "bert-base-chinese_s2t_dict.txt").read_text(encoding="utf-8")
               .splitlines() if line)
    several = [c for c, rs in readings.items() if len(rs) > 1]
    chosen = {s2t.get(c, c) for c in corpus} | set(several[:extra_polyphones])
    poly = [(c, r) for c in several if c in chosen for r in readings[c]]
    mono = [(c, rs[0]) for c, rs in readings.items() if len(rs) == 1 and c in set(corpus)]
    model_dir, tokenizer_dir = directory / "g2pW", directory / "bert-base-chinese"
    model_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "POLYPHONIC_CHARS.txt").write_text(
        "".join(f"{c}\t{r}\n" for c, r in poly), encoding="utf-8")
    (model_dir / "MONOPHONIC_CHARS.txt").write_text(
        "".join(f"{c}\t{r}\n" for c, r in mono), encoding="utf-8")
    vocab = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(string.punctuation)
             + list(string.digits + string.ascii_lowercase)
             + ["##" + c for c in string.digits + string.ascii_lowercase]
             + list("，。！？、；：“”") + sorted(readings))
    (tokenizer_dir / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    (model_dir / "config.py").write_text(
        f"model_source = {str(tokenizer_dir)!r}\nwindow_size = 32\nuse_mask = True\n"
        "use_char_phoneme = False\nbatch_size = 256\n")

    labels = sorted({r for _, r in poly})
    chars = sorted({c for c, _ in poly})
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64)
    config._attn_implementation = "eager"  # the exporter traces plain attention
    conditional = {"affect_location": "softmax", "bias": True, "char-linear": True,
                   "pos-linear": False, "char+pos-second": False,
                   "char+pos-second_lowrank": False, "char+pos-second_fm": False,
                   "fix_mode": None}
    inner = G2PW(config, labels, chars, ["UNK"], use_conditional=True,
                 param_conditional=conditional).eval()

    class SixInputs(torch.nn.Module):
        """The inputs piper-tts's converter feeds, and nothing else."""

        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                    attention_mask: torch.Tensor, phoneme_mask: torch.Tensor,
                    char_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
            probs: torch.Tensor = self.inner(input_ids, token_type_ids, attention_mask,
                                             phoneme_mask, char_ids, position_ids)
            return probs

    names = ["input_ids", "token_type_ids", "attention_mask", "phoneme_mask", "char_ids",
             "position_ids"]
    batch, length = 2, 10
    example = (torch.randint(0, len(vocab), (batch, length)),
               torch.zeros(batch, length, dtype=torch.long),
               torch.ones(batch, length, dtype=torch.long), torch.ones(batch, len(labels)),
               torch.zeros(batch, dtype=torch.long), torch.ones(batch, dtype=torch.long))
    axes = {n: {0: "batch", 1: "tokens"} for n in names[:3]}
    axes |= {n: {0: "batch"} for n in names[3:]} | {"probs": {0: "batch"}}
    torch.onnx.export(SixInputs().eval(), example, str(model_dir / "g2pw.onnx"),
                      dynamo=False, opset_version=15, input_names=names,
                      output_names=["probs"], dynamic_axes=axes)
