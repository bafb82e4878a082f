"""Regenerate bench/networks.json, the layers of the networks benchmark (``python -m bench networks``).

Every torch.nn.Conv2d that runs in a forward pass of six torchvision networks (resnet50,
mobilenet_v2, efficientnet_b0, convnext_tiny, regnet_y_400mf, inception_v3; built with
weights=None, so nothing is downloaded) on one 1x3x224x224 image, found with forward hooks,
grouped into distinct layers (input C, H, W, filters K, kernel, stride, padding, dilation,
groups) with how often each occurs in each network. The benchmark reads only the JSON, so
torchvision is needed here and nowhere else. Run it in any environment where torchvision
imports, from the repository root, e.g.:

    python3 -m venv /tmp/tvenv && /tmp/tvenv/bin/pip install torch torchvision
    /tmp/tvenv/bin/python tools/network_layers.py            # writes bench/networks.json
    /tmp/tvenv/bin/python tools/network_layers.py --out other.json

(networks.json was made with torch 2.14.1 and torchvision 0.29.1.)

inception_v3 is built as torchvision builds it without weights (aux_logits=True,
init_weights=False: the initial values do not matter here) and run at 224x224 like the
others. Its AuxLogits branch (2 Conv2d) runs only in training mode and not at all at 224
(its 5x5 conv would meet a 3x3 map), so the hooks, in eval mode, do not see it: the counts
are of the convolutions an inference pass runs.
"""
import argparse
import json
from pathlib import Path

NETWORKS = ("resnet50", "mobilenet_v2", "efficientnet_b0", "convnext_tiny", "regnet_y_400mf", "inception_v3")
IMAGE = (1, 3, 224, 224)
OUT = Path(__file__).resolve().parents[1] / "bench" / "networks.json"


def build(name):
    """The torchvision model ``name`` with random weights (nothing downloaded), in eval mode."""
    import torchvision.models as models

    extra = {"init_weights": False} if name == "inception_v3" else {}
    return getattr(models, name)(weights=None, **extra).eval()


def pair(value):
    """(h, w) from an int or a pair; a string padding ('same') is not used by these models."""
    if isinstance(value, int):
        return [value, value]
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return [int(value[0]), int(value[1])]
    raise ValueError(f"expected an int or an (h, w) pair, got {value!r}")


def conv_calls(model):
    """[(module name, layer dict)] for every Conv2d call of one forward pass on IMAGE."""
    import torch

    calls, handles = [], []

    def hook(name):
        def record(module, inputs, output):
            _, C, H, W = inputs[0].shape
            calls.append((name, {
                "C": int(C), "H": int(H), "W": int(W), "K": module.out_channels,
                "kh": module.kernel_size[0], "kw": module.kernel_size[1],
                "stride": pair(module.stride), "padding": pair(module.padding),
                "dilation": pair(module.dilation), "groups": module.groups,
                "OH": int(output.shape[2]), "OW": int(output.shape[3])}))
        return record

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Conv2d):
            handles.append(module.register_forward_hook(hook(name)))
    with torch.no_grad():
        model(torch.zeros(IMAGE))
    for h in handles:
        h.remove()
    return calls


KEY = ("C", "H", "W", "K", "kh", "kw", "stride", "padding", "dilation", "groups")


def collect(networks=NETWORKS):
    """The networks.json object: distinct layers in order of first appearance, with counts."""
    import torch
    import torchvision

    layers, per_network = {}, {}
    for net in networks:
        calls = conv_calls(build(net))
        for name, layer in calls:
            key = json.dumps([layer[k] for k in KEY])
            if key not in layers:
                layers[key] = {"id": f"{net}:{name}", **layer, "count": {}}
            count = layers[key]["count"]
            count[net] = count.get(net, 0) + 1
        per_network[net] = {"conv2d_layers": len(calls),
                            "distinct": sum(1 for lay in layers.values() if net in lay["count"])}
        print(f"{net}: {per_network[net]['distinct']} distinct of {len(calls)} Conv2d calls")
    return {"about": "Every distinct torch.nn.Conv2d run by a forward pass of these torchvision networks on one "
                     "1x3x224x224 image (weights=None; inception_v3 without its AuxLogits branch, which eval mode "
                     "does not run). Per layer: input C, H, W per image, filters K, kernel kh x kw, stride, "
                     "padding and dilation as (h, w), groups, output OH x OW, and {network: occurrences}. "
                     "Made by tools/network_layers.py; read by python -m bench networks.",
            "input": list(IMAGE), "torch": torch.__version__, "torchvision": torchvision.__version__,
            "networks": per_network, "layers": list(layers.values())}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(OUT), help=f"where to write (default {OUT})")
    args = ap.parse_args(argv)
    data = collect()
    # one network and one layer per line: the file stays readable and its diffs small
    nets = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in data["networks"].items())
    head = "".join(f" {json.dumps(k)}: {json.dumps(v)},\n" for k, v in data.items() if k not in ("networks", "layers"))
    rows = ",\n".join("  " + json.dumps(layer) for layer in data["layers"])
    Path(args.out).write_text(f"{{\n{head} \"networks\": {{\n{nets}\n }},\n \"layers\": [\n{rows}\n ]\n}}\n")
    print(f"wrote {args.out}: {len(data['layers'])} distinct layers")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
