"""Model zoo for ember's model tests: small torch nets exported to ONNX, and the onnx wheel's light models.

Torch models get fixed-seed random weights with non-trivial BatchNorm (random running mean/var, random
affine), so a fused and an unfused export compute the same non-trivial function. Each export is written
once into `.cache/models/` at the repo root (git-ignored), named `<model>-<key>.onnx` where the key hashes
this file and the torch/onnxscript/onnx versions: an edit here or an upgrade re-exports, a re-run reuses.

The onnx wheel's nine light models (onnx/backend/test/data/light) carry their weights as ConstantOfShape
outputs, i.e. every weight is 0.02: their outputs are uniform (softmax = 1/1000 whatever the convolutions
computed), so they test op coverage and shapes only. `light_randomized` writes a copy whose weights are
fixed-seed random initializers (He-scaled, BatchNorm stats sane, head rescaled so logits have std ~3),
which makes the same graphs a numeric test.

Run `python tests/models/zoo.py` to export everything and print export times and op types per file.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import io
import logging
import os
import time
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import numpy_helper

if TYPE_CHECKING:
    import torch
    from torch import nn

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / ".cache" / "models"
LIGHT_DIR = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
LIGHT_NAMES = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)
INPUT_NAME = "input"
OUTPUT_NAME = "output"
SMALL_INPUT = (3, 64, 64)  # per-sample input of the small nets
RESNET_INPUT = (3, 224, 224)

# Seconds each export took in this process (0.0 when the cached file was reused); read by the conftest.
EXPORT_SECONDS: dict[str, float] = {}


class ExportUnavailable(RuntimeError):
    """An exporter failed in this environment; the text says why (tests skip that variant with it)."""


# ------------------------------------------------------------------------------------------- caching


@functools.cache
def _cache_key() -> str:
    # The metadata lookup avoids importing torch (seconds) when only light models are wanted.
    h = hashlib.sha256(Path(__file__).read_bytes())
    for dist in ("torch", "onnxscript", "onnx"):
        try:
            h.update(f"{dist}={importlib.metadata.version(dist)};".encode())
        except importlib.metadata.PackageNotFoundError:
            pass
    return h.hexdigest()[:10]


def _cached(name: str, write: Callable[[Path], None]) -> Path:
    """The cached export `name`, writing it with `write(tmp_path)` first if missing."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    path = CACHE_DIR / f"{name}-{_cache_key()}.onnx"
    if path.exists():
        EXPORT_SECONDS.setdefault(name, 0.0)
        return path
    for stale in CACHE_DIR.glob(f"{name}-*.onnx"):  # exports by an older zoo.py or torch
        stale.unlink(missing_ok=True)
    # Write beside the target and rename, so a crashed or parallel run never leaves half a file.
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    t0 = time.perf_counter()
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    EXPORT_SECONDS[name] = time.perf_counter() - t0
    return path


# ------------------------------------------------------------------------------------ torch models


def _nn() -> Any:
    # torch is imported on first use so collecting the tests (and the light models) does not pay for it.
    import torch
    from torch import nn

    return torch, nn


def _conv_bn(nn: Any, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> list[Any]:
    return [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]


def build_resnet18(num_classes: int = 1000) -> nn.Module:
    """ResNet-18 as in torchvision (torchvision is not available), BasicBlock x [2, 2, 2, 2]."""
    torch, nn = _nn()

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                *_conv_bn(nn, cin, cout, 3, stride), nn.ReLU(inplace=True), *_conv_bn(nn, cout, cout, 3)
            )
            self.short = (
                nn.Sequential(*_conv_bn(nn, cin, cout, 1, stride))
                if stride != 1 or cin != cout
                else nn.Identity()
            )
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.relu(self.body(x) + self.short(x))

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(
                nn.Conv2d(3, 64, 7, 2, 3, bias=False),
                nn.BatchNorm2d(64),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, 2, 1),
            )
            blocks, cin = [], 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
                cin = cout
            self.layers = nn.Sequential(*blocks)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512, num_classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.pool(self.layers(self.stem(x)))
            return self.fc(torch.flatten(x, 1))

    return ResNet18()


def _classifier_head(nn: Any, cin: int, num_classes: int) -> Any:
    # Every small net ends the same way: global pool, Flatten, Gemm, Softmax.
    return nn.Sequential(
        nn.AdaptiveAvgPool2d(1), nn.Flatten(1), nn.Linear(cin, num_classes), nn.Softmax(dim=1)
    )


def build_mobilenetv2(num_classes: int = 10) -> nn.Module:
    """MobileNetV2-style: inverted residuals (1x1 expand, 3x3 depthwise, 1x1 project) with ReLU6."""
    torch, nn = _nn()

    class InvertedResidual(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
            super().__init__()
            hidden = cin * expand
            self.residual = stride == 1 and cin == cout
            self.body = nn.Sequential(
                *_conv_bn(nn, cin, hidden, 1), nn.ReLU6(inplace=True),
                *_conv_bn(nn, hidden, hidden, 3, stride, groups=hidden), nn.ReLU6(inplace=True),
                *_conv_bn(nn, hidden, cout, 1),
            )  # fmt: skip

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.body(x)
            return x + y if self.residual else y

    return nn.Sequential(
        *_conv_bn(nn, 3, 16, 3, 2), nn.ReLU6(inplace=True),
        InvertedResidual(16, 16, 1, 4),
        InvertedResidual(16, 24, 2, 6),
        InvertedResidual(24, 24, 1, 6),
        InvertedResidual(24, 32, 2, 6),
        *_conv_bn(nn, 32, 96, 1), nn.ReLU6(inplace=True),
        _classifier_head(nn, 96, num_classes),
    )  # fmt: skip


def _squeeze_excite(nn: Any, c: int, squeeze: int, act: Any, gate: Any) -> Any:
    torch, _ = _nn()

    class SqueezeExcite(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Sequential(nn.Conv2d(c, squeeze, 1), act, nn.Conv2d(squeeze, c, 1), gate)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.fc(self.pool(x))

    return SqueezeExcite()


def build_mobilenetv3(num_classes: int = 10) -> nn.Module:
    """MobileNetV3-style: HardSwish, squeeze-excite gated by HardSigmoid, 3x3 and 5x5 depthwise convs."""
    torch, nn = _nn()

    class Bneck(nn.Module):
        def __init__(self, cin: int, hidden: int, cout: int, k: int, stride: int, se: bool) -> None:
            super().__init__()
            self.residual = stride == 1 and cin == cout
            layers = [*_conv_bn(nn, cin, hidden, 1), nn.Hardswish()]
            layers += [*_conv_bn(nn, hidden, hidden, k, stride, groups=hidden), nn.Hardswish()]
            if se:
                layers.append(_squeeze_excite(nn, hidden, hidden // 4, nn.ReLU(), nn.Hardsigmoid()))
            layers += _conv_bn(nn, hidden, cout, 1)
            self.body = nn.Sequential(*layers)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.body(x)
            return x + y if self.residual else y

    return nn.Sequential(
        *_conv_bn(nn, 3, 16, 3, 2), nn.Hardswish(),
        Bneck(16, 64, 24, 3, 2, se=False),
        Bneck(24, 72, 24, 3, 1, se=True),
        Bneck(24, 96, 40, 5, 2, se=True),
        Bneck(40, 120, 40, 5, 1, se=True),
        *_conv_bn(nn, 40, 160, 1), nn.Hardswish(),
        _classifier_head(nn, 160, num_classes),
    )  # fmt: skip


def build_efficientnet(num_classes: int = 10) -> nn.Module:
    """EfficientNet-B0-style: MBConv with SiLU, squeeze-excite (SiLU/Sigmoid), depthwise and grouped convs."""
    torch, nn = _nn()

    class MBConv(nn.Module):
        def __init__(self, cin: int, cout: int, k: int, stride: int, expand: int, groups: int = 1) -> None:
            super().__init__()
            hidden = cin * expand
            self.residual = stride == 1 and cin == cout
            layers = [*_conv_bn(nn, cin, hidden, 1, groups=groups), nn.SiLU()] if expand != 1 else []
            layers += [*_conv_bn(nn, hidden, hidden, k, stride, groups=hidden), nn.SiLU()]
            layers.append(_squeeze_excite(nn, hidden, max(1, cin // 4), nn.SiLU(), nn.Sigmoid()))
            layers += _conv_bn(nn, hidden, cout, 1, groups=groups)
            self.body = nn.Sequential(*layers)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.body(x)
            return x + y if self.residual else y

    return nn.Sequential(
        *_conv_bn(nn, 3, 32, 3, 2), nn.SiLU(),
        MBConv(32, 16, 3, 1, 1),
        MBConv(16, 24, 3, 2, 6),
        MBConv(24, 24, 3, 1, 6, groups=2),  # grouped (not depthwise) 1x1 convs
        MBConv(24, 40, 5, 2, 6),
        MBConv(40, 40, 5, 1, 6, groups=4),
        *_conv_bn(nn, 40, 128, 1), nn.SiLU(),
        nn.Dropout(0.2),  # identity in eval; the exporter drops it
        _classifier_head(nn, 128, num_classes),
    )  # fmt: skip


def build_inception_block(num_classes: int = 10) -> nn.Module:
    """GoogLeNet-flavoured: ceil-mode max pool, a 4-branch Concat, average pool, a 3-way sum, and the
    `x.view(x.size(0), -1)` flatten that TorchScript exports as Shape/Gather/Unsqueeze/Concat/Reshape.

    No LRN: torch's LocalResponseNorm is a Python decomposition that exports as a 5-D Pad + 3-D
    AveragePool, not as ONNX LRN. The light models carry real LRN nodes (alexnet, inception_v1, zfnet512).
    """
    torch, nn = _nn()

    class Inception(nn.Module):
        def __init__(self, cin: int) -> None:
            super().__init__()
            relu = nn.ReLU
            self.b1 = nn.Sequential(nn.Conv2d(cin, 16, 1), relu())
            self.b3 = nn.Sequential(nn.Conv2d(cin, 12, 1), relu(), nn.Conv2d(12, 24, 3, padding=1), relu())
            self.b5 = nn.Sequential(nn.Conv2d(cin, 4, 1), relu(), nn.Conv2d(4, 8, 5, padding=2), relu())
            self.bp = nn.Sequential(nn.MaxPool2d(3, 1, 1), nn.Conv2d(cin, 8, 1), relu())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([self.b1(x), self.b3(x), self.b5(x), self.bp(x)], dim=1)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(
                nn.Conv2d(3, 32, 5, 2, 2), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True)
            )
            self.inc = Inception(32)
            self.avg = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
            self.alt = nn.Conv2d(56, 56, 1)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(56, num_classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.inc(self.stem(x))
            y = self.pool(y + self.avg(y) + self.alt(y))
            return torch.softmax(self.fc(y.view(y.size(0), -1)), dim=1)

    return Net()


def randomize_(model: nn.Module, seed: int, sample_shape: tuple[int, ...]) -> nn.Module:
    """Fixed-seed weights: He-normal convs, random BatchNorm affine and non-trivial running stats.

    Running stats drawn from thin air do not normalise anything: activations drift with depth until the
    output hardly depends on the input, so every row gets the same class. Instead they are measured on a
    random batch, as training would leave them, then jittered so they are not exact batch statistics.
    """
    torch, nn = _nn()
    g = torch.Generator().manual_seed(seed)
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                fan_in = m.weight[0].numel()
                m.weight.normal_(0.0, (2.0 / fan_in) ** 0.5, generator=g)
                if m.bias is not None:
                    m.bias.normal_(0.0, 0.1, generator=g)
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5, generator=g)
                m.bias.normal_(0.0, 0.2, generator=g)
            elif isinstance(m, nn.Linear):
                m.weight.normal_(0.0, m.in_features**-0.5, generator=g)
                m.bias.normal_(0.0, 0.1, generator=g)
        for bn in bns:
            bn.reset_running_stats()
            bn.momentum = None  # cumulative average: one pass sets the stats to that batch's
        model.train()
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.eval()  # dropout would draw from torch's global RNG: stats would differ run to run
        model(torch.from_numpy(input_array(f"bn-stats-{seed}", (8, *sample_shape))))
        for bn in bns:
            bn.running_mean.add_(torch.randn(bn.num_features, generator=g) * 0.1 * bn.running_var.sqrt())
            bn.running_var.mul_(torch.empty(bn.num_features).uniform_(0.7, 1.4, generator=g))
    return model.eval()


def _calibrate_head_(model: nn.Module, sample: torch.Tensor, target_std: float = 3.0) -> None:
    """Re-aim the last Linear: centre its input over `sample` (in the bias) and scale logits to ~target_std.

    Pooled features of a random net are nearly the same for every input, so the bias and the common part
    of the features would pick the class: every row the same argmax. Folding the mean feature into the
    bias leaves the input-dependent part to decide. And huge logits would make Softmax one-hot and its
    output ill-conditioned; moderate ones keep the 1e-4 relative comparison meaningful.
    """
    torch, nn = _nn()
    fc = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
    captured: list[torch.Tensor] = []
    handle = fc.register_forward_hook(lambda _m, inp, _out: captured.append(inp[0]))
    with torch.no_grad():
        model(sample)
        handle.remove()
        feats = captured[0]
        centred = (feats - feats.mean(0)) @ fc.weight.T
        scale = target_std / float(centred.std())
        fc.bias.copy_(scale * (0.3 * fc.bias - fc.weight @ feats.mean(0)))
        fc.weight.mul_(scale)


def input_array(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The fixed-seed input a test feeds model `name` (seeded by the name, so each model differs).

    An image batch gets per-sample contrast, per-channel offsets and a smooth stripe pattern on top of
    the noise: i.i.d. noise in every row sends every row to the same class, hiding batch mix-ups.
    """
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    x = rng.standard_normal(shape)
    if len(shape) == 4:
        n, c, h, w = shape
        yy, xx = np.meshgrid(np.linspace(0, 1, h), np.linspace(0, 1, w), indexing="ij")
        freq = rng.uniform(1, 8, (n, c, 2, 1, 1))
        phase = rng.uniform(0, 2 * np.pi, (n, c, 1, 1))
        stripes = np.sin(2 * np.pi * (freq[:, :, 0] * yy + freq[:, :, 1] * xx) + phase)
        x = x * rng.uniform(0.3, 1.0, (n, 1, 1, 1)) + 1.5 * stripes + rng.normal(0, 0.5, (n, c, 1, 1))
    return x.astype(np.float32)


@contextlib.contextmanager
def _quiet_export() -> Any:
    # The exporters print progress and deprecation notes; a test log does not need them.
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _prepared(build: Callable[[], nn.Module], input_shape: tuple[int, ...]) -> tuple[nn.Module, torch.Tensor]:
    """The randomized model, seeded by the builder's name so every export of it is the same function,
    and the example input to export it with."""
    torch, _ = _nn()
    model = randomize_(build(), zlib.crc32(build.__name__.encode()), input_shape)
    _calibrate_head_(model, torch.from_numpy(input_array(f"head-{build.__name__}", (16, *input_shape))))
    # Batch 2: a batch-1 trace can bake a literal 1 into shape arithmetic, and torch.export specialises
    # an example dim of size 1 to a constant.
    return model, torch.from_numpy(input_array(build.__name__, (2, *input_shape)))


def _torchscript_export(
    build: Callable[[], nn.Module], name: str, opset: int, input_shape: tuple[int, ...], keep_bn: bool = False
) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        torch, _ = _nn()
        model, sample = _prepared(build, input_shape)
        # PRESERVE keeps an eval-mode model's BatchNormalization nodes: EVAL mode folds them into the conv.
        training = torch.onnx.TrainingMode.PRESERVE if keep_bn else torch.onnx.TrainingMode.EVAL
        with _quiet_export():
            torch.onnx.export(
                model, (sample,), str(path), dynamo=False, opset_version=opset, training=training,
                input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
            )  # fmt: skip
        if keep_bn:
            ops = {n.op_type for n in onnx.load(str(path)).graph.node}
            assert "BatchNormalization" in ops, f"{name}: BatchNormalization was fused away: {sorted(ops)}"

    return write


def _dynamo_export(
    build: Callable[[], nn.Module], name: str, input_shape: tuple[int, ...]
) -> Callable[[Path], None]:
    # Works with torch 2.13 + onnxscript 0.7: opset 20, BatchNorm folded by its optimizer, the global pool
    # as ReduceMean and flatten as Reshape. Should a later stack fail, the test skips with the reason.
    def write(path: Path) -> None:
        torch, _ = _nn()
        model, sample = _prepared(build, input_shape)
        try:
            with _quiet_export():
                torch.onnx.export(
                    model, (sample,), str(path), dynamo=True, external_data=False,
                    input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                    dynamic_shapes=({0: torch.export.Dim("batch")},),
                )  # fmt: skip
        except Exception as e:  # the dynamo stack (torch.export + onnxscript) is version-sensitive
            raise ExportUnavailable(f"dynamo export of {name} failed: {type(e).__name__}: {e}") from e

    return write


# ------------------------------------------------------------------------------------ light models


def light_path(name: str) -> Path:
    return LIGHT_DIR / f"light_{name}.onnx"


def feed_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that are real feeds: IR 3 files list every initializer as an input too."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def light_models() -> dict[str, tuple[Path, tuple[int, ...]]]:
    """The onnx wheel's nine light models: name -> (path, input shape). All take one 1x3x224x224 input."""
    out = {}
    for name in LIGHT_NAMES:
        path = light_path(name)
        (inp,) = feed_inputs(onnx.load(str(path), load_external_data=False))
        shape = tuple(d.dim_value for d in inp.type.tensor_type.shape.dim)
        out[name] = (path, shape)
    return out


def _light_randomized_write(name: str) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        model = onnx.load(str(light_path(name)))
        randomize_light_(model, seed=zlib.crc32(name.encode()))
        onnx.save(model, str(path))

    return write


def light_randomized(name: str) -> Path:
    """A copy of light model `name` with its ConstantOfShape weights replaced by random initializers."""
    return _cached(f"light_{name}_random", _light_randomized_write(name))


def randomize_light_(model: onnx.ModelProto, seed: int) -> None:
    """Swap each ConstantOfShape weight for a random initializer suited to the input it feeds."""
    g = model.graph
    rng = np.random.default_rng(seed)
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in g.node:
        for i, x in enumerate(node.input):
            consumers.setdefault(x, []).append((node, i))

    def role(tensor: str) -> tuple[str, int]:
        node, idx = consumers[tensor][0]
        if node.op_type == "Unsqueeze":  # densenet/inception_v2 apply per-channel Mul/Add after Unsqueeze
            return role(node.output[0])
        return node.op_type, idx

    def gemm_fan_in(tensor: str, shape: tuple[int, ...]) -> int:
        node, _ = consumers[tensor][0]
        trans_b = any(a.name == "transB" and a.i for a in node.attribute)
        return shape[1] if trans_b else shape[0]

    keep, new_inits = [], []
    for node in g.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in inits:
            keep.append(node)
            continue
        out = node.output[0]
        shape = tuple(int(s) for s in inits[node.input[0]])
        op, idx = role(out)
        if (op, idx) == ("Conv", 1):
            w = rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))
        elif (op, idx) == ("Gemm", 1):
            w = rng.standard_normal(shape) * np.sqrt(2.0 / gemm_fan_in(out, shape))
        elif (op, idx) in (("BatchNormalization", 1), ("BatchNormalization", 4), ("Mul", 1)):
            w = rng.uniform(0.5, 1.5, shape)  # scale, variance: positive, near 1
        elif op in ("Conv", "Gemm", "BatchNormalization", "Add"):
            w = rng.normal(0.0, 0.1, shape)  # biases, means, shifts
        else:  # anything else keeps the file's constant
            (value,) = (numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value")
            w = np.full(shape, value.ravel()[0])
        new_inits.append(numpy_helper.from_array(w.astype(np.float32), out))
    del g.node[:]
    g.node.extend(keep)
    # Drop the shape initializers only the removed ConstantOfShape nodes read.
    used = {x for n in g.node for x in n.input} | {o.name for o in g.output}
    dead = {t.name for t in g.initializer if t.name not in used}
    kept_inits = [t for t in g.initializer if t.name not in dead]
    kept_inputs = [i for i in g.input if i.name not in dead]
    del g.initializer[:], g.input[:]
    g.initializer.extend([*kept_inits, *new_inits])
    g.input.extend(kept_inputs)
    if model.ir_version < 4:  # IR 3: every initializer must also be a graph input
        g.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in new_inits)
    _calibrate_light_head_(model)


# Ops through which scaling the final layer's weights and bias by c > 0 scales the logits by c.
_HOMOGENEOUS = {"Relu", "GlobalAveragePool", "AveragePool", "MaxPool", "Reshape", "Flatten", "Dropout"}


def _calibrate_light_head_(model: onnx.ModelProto, target_std: float = 3.0) -> None:
    """Rescale the last Conv/Gemm before Softmax so the logits have std ~target_std (see _calibrate_head_)."""
    import onnxruntime as ort

    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    softmax = [n for n in g.node if n.op_type == "Softmax"]
    if not softmax:  # densenet121 ends in a pool: no Softmax to saturate
        return
    logits = softmax[-1].input[0]
    node = producer[logits]
    while node.op_type in _HOMOGENEOUS:
        node = producer[node.input[0]]
    assert node.op_type in ("Conv", "Gemm"), f"cannot calibrate through {node.op_type}"

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(onnx.ValueInfoProto(name=logits))
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    (inp,) = feed_inputs(model)
    shape = tuple(d.dim_value for d in inp.type.tensor_type.shape.dim)
    x = input_array(model.graph.name or "light", shape)
    value = sess.run([logits], {inp.name: x})[0]
    scale = target_std / float(value.std())

    by_name = {t.name: t for t in g.initializer}
    for name in node.input[1:]:
        if name in by_name:  # inception_v1's Gemm bias is computed (Reshape of a constant): left as is
            t = by_name[name]
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * np.float32(scale), name))


# --------------------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class ZooModel:
    """One model the tests run: how to get its file, its per-sample input shape, and planning facts."""

    name: str
    path: Callable[[], Path]  # exports on first call (may raise ExportUnavailable)
    sample_shape: tuple[int, ...]  # input shape without the batch dim
    dynamic_batch: bool  # the file's batch dim is symbolic, so batch 8 runs on the same file
    gflop: float  # per sample, approximate (2 x MACs of Conv/Gemm), for sizing the test matrix
    exported: bool  # produced by a torch exporter (needs torch; counts towards export time)


def _ts(
    name: str,
    build: Callable[[], nn.Module],
    opset: int,
    shape: tuple[int, ...],
    gflop: float,
    keep_bn: bool = False,
) -> ZooModel:
    write = _torchscript_export(build, name, opset, shape, keep_bn)
    return ZooModel(name, functools.partial(_cached, name, write), shape, True, gflop, True)


def torch_models() -> list[ZooModel]:
    r18, small = RESNET_INPUT, SMALL_INPUT
    dynamo = _dynamo_export(build_resnet18, "resnet18_dynamo", r18)
    return [
        _ts("resnet18_opset9", build_resnet18, 9, r18, 3.6),
        _ts("resnet18_opset17", build_resnet18, 17, r18, 3.6),
        ZooModel(
            "resnet18_dynamo", functools.partial(_cached, "resnet18_dynamo", dynamo), r18, True, 3.6, True
        ),
        # opset 13 with BatchNormalization-9 left unfused; the other variants fold it into the convs.
        _ts("resnet18_bn_unfused", build_resnet18, 13, r18, 3.6, keep_bn=True),
        # opset 11: ReLU6 becomes Clip with min/max *inputs* (opset 9's Clip has attributes).
        _ts("mobilenetv2", build_mobilenetv2, 11, small, 0.018),
        # opset 17: native HardSwish (opset 14+), HardSigmoid, unfused BatchNormalization-15.
        _ts("mobilenetv3", build_mobilenetv3, 17, small, 0.011, keep_bn=True),
        _ts("efficientnet", build_efficientnet, 13, small, 0.016),
        # opset 10: the first with MaxPool/AveragePool ceil_mode.
        _ts("inception_block", build_inception_block, 10, small, 0.005),
    ]


# Per-sample GFLOP (2 x MACs of Conv/Gemm) of the light models at 224x224, for sizing the test matrix.
LIGHT_GFLOP = {
    "bvlc_alexnet": 1.3, "densenet121": 5.7, "inception_v1": 2.9, "inception_v2": 4.0, "resnet50": 8.2,
    "shufflenet": 0.25, "squeezenet": 0.7, "vgg19": 39.3, "zfnet512": 3.0,
}  # fmt: skip


def light_zoo() -> list[ZooModel]:
    models = []
    for name, (path, shape) in light_models().items():
        models.append(ZooModel(f"light_{name}", lambda p=path: p, shape[1:], False, LIGHT_GFLOP[name], False))
    return models


# Light models worth a random-weights copy: the rest (alexnet, vgg19, zfnet512) are plain conv/LRN/FC
# stacks whose ops the others and the torch nets cover, and whose big FC layers would mean 0.25-0.6 GB files.
LIGHT_RANDOMIZED = ("densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet")


def light_random_zoo() -> list[ZooModel]:
    shapes = {name: shape[1:] for name, (_, shape) in light_models().items()}
    return [
        ZooModel(
            f"light_{n}_random",
            functools.partial(light_randomized, n),
            shapes[n],
            False,
            LIGHT_GFLOP[n],
            False,
        )
        for n in LIGHT_RANDOMIZED
    ]


def all_models() -> dict[str, ZooModel]:
    return {m.name: m for m in [*torch_models(), *light_zoo(), *light_random_zoo()]}


def op_types(path: Path) -> list[str]:
    """Sorted op types (domain-qualified outside the default domain) a file's main graph uses."""
    model = onnx.load(str(path), load_external_data=False)
    return sorted(
        {n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in model.graph.node}
    )


def opset(path: Path) -> int:
    model = onnx.load(str(path), load_external_data=False)
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def main() -> None:
    t_all = time.perf_counter()
    for m in all_models().values():
        try:
            path = m.path()
        except ExportUnavailable as e:
            print(f"{m.name:28s} UNAVAILABLE: {e}")
            continue
        took = EXPORT_SECONDS.get(m.name, 0.0)
        size = path.stat().st_size / 1e6
        print(f"{m.name:28s} opset {opset(path):2d} {took:6.1f} s {size:7.1f} MB  {' '.join(op_types(path))}")
    print(f"total {time.perf_counter() - t_all:.1f} s (exports: {sum(EXPORT_SECONDS.values()):.1f} s)")


if __name__ == "__main__":
    main()
