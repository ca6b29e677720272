"""PyTorch mirrors of ``farm.models.architectures`` (BERT-style encoder, ResNet-18), for TorchScript.

``bert_module`` / ``resnet_module`` return eval-mode modules with the ONNX builders' seeded weights
(``load_onnx_weights``), so the ONNX file and the TorchScript file of a kind compute the same function.
Attention is ``torch.nn.functional.scaled_dot_product_attention``. torch is imported on first use.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from farm.errors import RequestError
from farm.models.architectures import BERT_DEFAULTS, BERT_SEQ, RESNET_BLOCKS, RESNET_DEFAULTS, bert_model, resnet_model
from farm.models.spec import FARM_INPUTS_EXTRA, onnx_modules
from farm.models.torchscript import require_torch


def _bert_class() -> type:
    """The BERT-style encoder class (defined on first use so importing this file never needs torch)."""
    torch = require_torch()
    nn: Any = torch.nn
    functional: Any = torch.nn.functional

    class Attention(nn.Module):
        def __init__(self, hidden: int, heads: int) -> None:
            super().__init__()
            self.heads = heads
            self.q, self.k, self.v = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
            self.out = nn.Linear(hidden, hidden)

        def forward(self, x):  # noqa: ANN001, ANN201 (TorchScript: Tensor -> Tensor)
            b, n, d = x.size(0), x.size(1), x.size(2)
            q = self.q(x).view(b, n, self.heads, d // self.heads).transpose(1, 2)
            k = self.k(x).view(b, n, self.heads, d // self.heads).transpose(1, 2)
            v = self.v(x).view(b, n, self.heads, d // self.heads).transpose(1, 2)
            ctx = functional.scaled_dot_product_attention(q, k, v)
            return self.out(ctx.transpose(1, 2).reshape(b, n, d))

    class FeedForward(nn.Module):
        def __init__(self, hidden: int, ffn: int) -> None:
            super().__init__()
            self.up, self.down = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

        def forward(self, x):  # noqa: ANN001, ANN201
            return self.down(functional.gelu(self.up(x)))

    class EncoderLayer(nn.Module):
        def __init__(self, hidden: int, heads: int, ffn: int) -> None:
            super().__init__()
            self.attn, self.ffn = Attention(hidden, heads), FeedForward(hidden, ffn)
            self.ln1, self.ln2 = nn.LayerNorm(hidden, eps=1e-12), nn.LayerNorm(hidden, eps=1e-12)

        def forward(self, x):  # noqa: ANN001, ANN201
            x = self.ln1(x + self.attn(x))
            return self.ln2(x + self.ffn(x))

    class Embeddings(nn.Module):
        def __init__(self, vocab: int, hidden: int, max_positions: int) -> None:
            super().__init__()
            self.word, self.position = nn.Embedding(vocab, hidden), nn.Embedding(max_positions, hidden)
            self.ln = nn.LayerNorm(hidden, eps=1e-12)

        def forward(self, input_ids):  # noqa: ANN001, ANN201
            positions = torch.arange(input_ids.size(1), device=input_ids.device)
            return self.ln(self.word(input_ids) + self.position(positions))

    class Bert(nn.Module):
        """BERT-style encoder with mean pooling (``farm.models.architectures.bert_model``)."""

        def __init__(self, vocab: int, hidden: int, layers: int, heads: int, ffn: int, max_positions: int) -> None:
            super().__init__()
            self.embeddings = Embeddings(vocab, hidden, max_positions)
            self.layers = nn.ModuleList([EncoderLayer(hidden, heads, ffn) for _ in range(layers)])

        def forward(self, input_ids):  # noqa: ANN001, ANN201
            x = self.embeddings(input_ids)
            for layer in self.layers:
                x = layer(x)
            return x.mean(dim=1)

    return Bert


def _resnet_class() -> type:
    """The ResNet-18 class (defined on first use)."""
    torch = require_torch()
    nn: Any = torch.nn

    class BasicBlock(nn.Module):
        def __init__(self, c_in: int, c_out: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(c_out)
            self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(c_out)
            project = stride != 1 or c_in != c_out
            self.downsample = (nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, 0, bias=False), nn.BatchNorm2d(c_out))
                               if project else nn.Identity())

        def forward(self, x):  # noqa: ANN001, ANN201
            h = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
            return torch.relu(h + self.downsample(x))

    class ResNet18(nn.Module):
        """ResNet-18 (``farm.models.architectures.resnet_model``)."""

        def __init__(self, width: int, classes: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            c_in, stages = width, []
            for stage, blocks in enumerate(RESNET_BLOCKS):
                c_out = width * 2 ** stage
                stages.append(nn.Sequential(*[BasicBlock(c_in if b == 0 else c_out, c_out,
                                                         2 if b == 0 and stage > 0 else 1) for b in range(blocks)]))
                c_in = c_out
            self.layer1, self.layer2, self.layer3, self.layer4 = stages
            self.fc = nn.Linear(c_in, classes)

        def forward(self, input):  # noqa: ANN001, ANN201
            x = torch.max_pool2d(torch.relu(self.bn1(self.conv1(input))), 3, 2, 1)
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(torch.mean(x, dim=(2, 3), keepdim=True), 1))

    return ResNet18


def load_onnx_weights(module: Any, onnx_model: Any) -> Any:
    """Copy the ONNX initializers named like ``module``'s state_dict keys into it (MatMul weights, stored
    ``[in, out]``, are transposed to Linear's ``[out, in]``); returns ``module`` in eval mode. Every
    parameter and buffer must be found (BatchNorm's ``num_batches_tracked`` excepted)."""
    torch = require_torch()
    _, _, numpy_helper = onnx_modules()
    arrays = {i.name: numpy_helper.to_array(i) for i in onnx_model.graph.initializer}
    matmul_weights = {n.input[1] for n in onnx_model.graph.node if n.op_type == "MatMul"}
    state = module.state_dict()
    for key in state:
        if key.endswith("num_batches_tracked"):
            continue
        arr = arrays[key].T if key in matmul_weights else arrays[key]
        state[key] = torch.from_numpy(arr.copy())
    module.load_state_dict(state, strict=True)
    return module.eval()


def bert_module(**kw: int) -> Any:
    """The BERT-style encoder with ``bert_model(**kw)``'s weights (defaults: ``BERT_DEFAULTS``)."""
    sizes = {**BERT_DEFAULTS, **kw}
    return load_onnx_weights(_bert_class()(**sizes), bert_model(**sizes))


def resnet_module(**kw: int) -> Any:
    """ResNet-18 with ``resnet_model(**kw)``'s weights (defaults: ``RESNET_DEFAULTS``)."""
    sizes = {**RESNET_DEFAULTS, **kw}
    module = _resnet_class()(width=sizes["width"], classes=sizes["classes"])
    return load_onnx_weights(module, resnet_model(**sizes))


def build_torchscript_architecture(kind: str, out: Path, **kw: int) -> Path:
    """Script ``bert-tiny`` or ``resnet18`` (sizes ``kw`` as the ONNX builders) and save it to ``out``
    with its per-sample inputs declared in ``extra/farm_inputs.json``; returns ``out``."""
    torch = require_torch()
    try:
        if kind == "bert-tiny":
            seq = min(BERT_SEQ, kw.get("max_positions", BERT_DEFAULTS["max_positions"]))
            module, inputs = bert_module(**kw), [f"input_ids:INT64:{seq}"]
        elif kind == "resnet18":
            image = kw.get("image", RESNET_DEFAULTS["image"])
            module, inputs = resnet_module(**kw), [f"input:FP32:3x{image}x{image}"]
        else:
            raise RequestError(f"unknown TorchScript architecture {kind!r}; choose bert-tiny or resnet18")
    except TypeError as exc:
        raise RequestError(f"bad option for example model {kind!r}: {exc}") from None
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(module), str(out), _extra_files={FARM_INPUTS_EXTRA: json.dumps(inputs)})
    return out
