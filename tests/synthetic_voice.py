"""Random-weight VITS models of every Piper variant, and ONNX files laid out as Piper's
exporter lays them out (anonymous weights named by their consuming node, a folded constant),
so the loader and the streaming decoder can be tested beyond the one bundled voice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from tts.vits import Vits, VitsConfig

VARIANTS: dict[str, VitsConfig] = {
    "x_low": VitsConfig(hidden_channels=96, inter_channels=96, filter_channels=384),
    "low": VitsConfig(),  # medium's architecture at 16 kHz
    "medium": VitsConfig(),
    "high": VitsConfig(resblock="1", resblock_kernel_sizes=(3, 7, 11),
                       resblock_dilation_sizes=((1, 3, 5), (1, 3, 5), (1, 3, 5)),
                       upsample_rates=(8, 8, 2, 2), upsample_initial_channel=512,
                       upsample_kernel_sizes=(16, 16, 4, 4)),
    "multi_speaker": VitsConfig(n_speakers=4, gin_channels=512),
    "plain_dp": VitsConfig(use_sdp=False),
}


def random_model(config: VitsConfig, seed: int = 0) -> Vits:
    torch.manual_seed(seed)
    model = Vits(config).eval()
    with torch.no_grad():  # keep the random flows tame: small coupling outputs
        for name, p in model.named_parameters():
            if ".post." in name or name.endswith("logs"):
                p.mul_(0.1)
    return model


def _node_path(key: str) -> str:
    """``flow.flows.0.enc.in_layers.1.weight`` -> ``/flow/flows.0/enc/in_layers.1``."""
    parts = key.split(".")[:-1]
    out: list[str] = []
    for p in parts:
        if p.isdigit() and out:
            out[-1] += "." + p
        else:
            out.append(p)
    return "/" + "/".join(out)


def export_like_piper(model: Vits, path: Path) -> None:
    """Write the model's weights as Piper's ONNX export names them (graph not runnable)."""
    inits, nodes = [], []
    anon = 9000
    for key, tensor in model.state_dict().items():
        value = tensor.numpy()
        if key.startswith("dp.flows.1."):
            continue  # unused at inference: Piper's export drops it
        if key == "dp.flows.0.logs":
            inits.append(numpy_helper.from_array(np.exp(-value), "/dp/flows.0/Exp_output_0"))
            continue
        module = _node_path(key)
        if key == "enc_p.emb.weight":
            inits.append(numpy_helper.from_array(value, "sid"))
            nodes.append(helper.make_node("Gather", ["sid", "input"], ["emb"],
                                          name=f"{module}/Gather"))
            continue
        if key.startswith("flow.") and ".enc." in key and key.endswith(".weight"):
            anon += 3
            name = f"onnx::Conv_{anon}"
            inits.append(numpy_helper.from_array(value, name))
            nodes.append(helper.make_node("Conv", ["x", name, key[:-6] + "bias"], [name + "o"],
                                          name=f"{module}/Conv"))
            continue
        inits.append(numpy_helper.from_array(value, key))
    c = model.config
    for i, u in enumerate(c.upsample_rates):
        nodes.append(helper.make_node("ConvTranspose", ["x", f"dec.ups.{i}.weight"], [f"u{i}"],
                                      name=f"/dec/ups.{i}/ConvTranspose", strides=[u]))
    conv = "convs1" if c.resblock == "1" else "convs"
    for i in range(len(c.upsample_rates)):
        for j, dilations in enumerate(c.resblock_dilation_sizes):
            block = i * len(c.resblock_kernel_sizes) + j
            for m, d in enumerate(dilations):
                nodes.append(helper.make_node(
                    "Conv", ["x", f"dec.resblocks.{block}.{conv}.{m}.weight"], [f"r{block}{m}"],
                    name=f"/dec/resblocks.{block}/{conv}.{m}/Conv", dilations=[d]))
    graph = helper.make_graph(nodes, "vits", [], [], initializer=inits)
    onnx.save(helper.make_model(graph), str(path))


def install_test_voice(directory: Path, name: str = "xx_XX-test-x_low") -> str:
    """A second installed voice (random weights, 16 kHz, language xx_XX) in ``directory``,
    so that a test can tell which voice spoke by the audio's sample rate."""
    import json

    from tts import VoiceCatalog

    directory.mkdir(parents=True, exist_ok=True)
    export_like_piper(random_model(VARIANTS["x_low"]), directory / f"{name}.onnx")
    default = VoiceCatalog().resolve(None)
    config = json.loads(default.config_path.read_text())
    config["audio"] = {"sample_rate": 16000, "quality": "x_low"}
    config["language"] = {"code": "xx_XX"}
    (directory / f"{name}.onnx.json").write_text(json.dumps(config))
    return name
