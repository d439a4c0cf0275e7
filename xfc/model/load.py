"""Read an ONNX model, check it, fix its dynamic input shapes and infer every tensor's shape.

Everything that can be wrong with the file itself is found here and reported as one line
(OperatorError, exit status 2) naming the file and the input, node or field at fault: not ONNX
or unreadable, rejected by the ONNX checker, an opset outside SUPPORTED_OPSETS, a dynamic input
dimension that --input-shape did not fix, a bad --input-shape. Messages about input shapes name
them as the caller's user gives them (ShapeSpelling): `--input-shape x=1x3x8x8` on the command
line, `input_shapes={'x': (1, 3, 8, 8)}` in Python.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

import numpy as np

from ..errors import OperatorError

# Oldest default-domain opset whose operator semantics xfc maps (Conv/Gemm/BatchNormalization/
# Clip as of opset 7), and the newest the installed onnx package knows (its checker, shape
# inference and reference evaluator all stop there).
MIN_OPSET = 7

FLOAT_TYPES = (1,)   # onnx.TensorProto.FLOAT: the only element type xfc kernels take


def max_opset() -> int:
    import onnx.defs
    return int(onnx.defs.onnx_opset_version())


def _one_line(exc: BaseException, limit: int = 240) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A checked model with fixed input shapes and inferred tensor shapes."""

    path: str
    model: object                                   # onnx.ModelProto (shapes inferred)
    opset: int                                      # default-domain opset
    inputs: tuple[tuple[str, tuple[int, ...], int], ...]   # real inputs: (name, shape, elem_type)
    outputs: tuple[str, ...]
    constants: Mapping[str, np.ndarray]             # initializers, Constant node outputs, Identity / Cast of those
    shapes: Mapping[str, Optional[tuple[int, ...]]] = field(default_factory=dict)  # None: not inferred
    types: Mapping[str, int] = field(default_factory=dict)                         # onnx elem_type

    def shape(self, name: str) -> Optional[tuple[int, ...]]:
        if name in self.constants:
            return tuple(self.constants[name].shape)
        return self.shapes.get(name)


@dataclass(frozen=True)
class ShapeSpelling:
    """How a user fixes input shapes, for the messages that ask them to: the command line's
    `--input-shape NAME=DIMS` or the Python API's `input_shapes={NAME: DIMS}`."""

    option: str            # what the messages call it: '--input-shape' / 'input_shapes'
    api: bool = False

    def entry(self, name: Optional[str], shape) -> str:
        """One given shape, as the user wrote it (to name it in an error)."""
        if self.api:
            return f"{self.option}[{name!r}] = {tuple(shape)}"
        return f"{self.option} {name + '=' if name else ''}{'x'.join(map(str, shape))}"

    def fix(self, shapes: Mapping[str, tuple]) -> str:
        """What to pass to fix these inputs, ready to paste."""
        if self.api:
            return f"{self.option}={ {n: tuple(s) for n, s in shapes.items()} }"
        return " ".join(self.entry(n, s) for n, s in shapes.items())


CLI_SHAPES = ShapeSpelling("--input-shape")
API_SHAPES = ShapeSpelling("input_shapes", api=True)


def parse_input_shapes(items) -> dict[Optional[str], tuple[int, ...]]:
    """['x=1x3x224x224', ...] -> {'x': (1, 3, 224, 224)}. A bare '1x3x224x224' applies to the
    model's only dynamic input (key None)."""
    shapes: dict[Optional[str], tuple[int, ...]] = {}
    for item in items or ():
        text = str(item).strip()
        name, sep, dims = text.rpartition("=")
        name = name.strip() if sep else None
        if sep and not name:
            raise OperatorError(f"--input-shape '{text}': the input name before '=' is empty")
        parts = [p for p in re.split(r"[x,]", dims.strip().lower())]
        try:
            shape = tuple(int(p) for p in parts)
        except ValueError:
            raise OperatorError(f"--input-shape '{text}': dimensions must be positive integers joined by 'x' "
                                f"(e.g. input=1x3x224x224)") from None
        if not shape or any(d < 1 for d in shape):
            raise OperatorError(f"--input-shape '{text}': dimensions must be positive integers joined by 'x'")
        if name in shapes:
            raise OperatorError(f"--input-shape for {'input ' + repr(name) if name else 'the input'} is given twice")
        shapes[name] = shape
    return shapes


def _read(path: Path):
    import onnx
    from google.protobuf.message import DecodeError
    if not path.exists():
        raise OperatorError(f"{path}: no such file")
    if not path.is_file():
        raise OperatorError(f"{path}: not a file")
    try:
        model = onnx.load(str(path))
    except DecodeError:
        raise OperatorError(f"{path}: not an ONNX model (the file is not an ONNX protobuf)") from None
    except OSError as exc:
        raise OperatorError(f"{path}: cannot read: {exc.strerror or _one_line(exc)}") from None
    except Exception as exc:  # external data missing, truncated file, ...: never a traceback
        raise OperatorError(f"{path}: cannot load the ONNX model: {_one_line(exc)}") from None
    if not model.graph.node and not model.graph.output:
        raise OperatorError(f"{path}: not an ONNX model (no graph in the file)")
    return model


def _opset(path: Path, model) -> int:
    versions = {imp.domain or "ai.onnx": imp.version for imp in model.opset_import}
    if "ai.onnx" not in versions:
        raise OperatorError(f"{path}: the model imports no default-domain (ai.onnx) opset")
    version, top = int(versions["ai.onnx"]), max_opset()
    if not MIN_OPSET <= version <= top:
        raise OperatorError(f"{path}: opset {version} is outside the supported range {MIN_OPSET}..{top}")
    return version


def _dims(value_info) -> Optional[list]:
    """Dimensions of a tensor value info: ints, or a dim_param string / None where dynamic."""
    t = value_info.type
    if t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
        return None
    out = []
    for d in t.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            out.append(int(d.dim_value))
        else:
            out.append(d.dim_param or None)
    return out


def _fix_inputs(path: Path, model, requested: dict, spelling: ShapeSpelling) -> list:
    """Apply --input-shape to the real (non-initializer) inputs; every input must end up static."""
    initializers = {t.name for t in model.graph.initializer}
    real = [vi for vi in model.graph.input if vi.name not in initializers]
    names = [vi.name for vi in real]
    requested = dict(requested)
    if None in requested:
        dynamic = [vi.name for vi in real if _dims(vi) is None or any(not isinstance(d, int) for d in _dims(vi))]
        if len(dynamic) != 1:
            raise OperatorError(f"{spelling.entry(None, requested[None])} without a name needs exactly "
                                f"one dynamic input; {path} has {len(dynamic)} ({', '.join(dynamic) or 'none'}): "
                                f"use NAME=DIMS")
        requested[dynamic[0]] = requested.pop(None)
    for name in requested:
        if name not in names:
            raise OperatorError(f"{spelling.option}: {path} has no input '{name}' "
                                f"(inputs: {', '.join(names) or 'none'})")
    fixed, unfixed = [], []
    for vi in real:
        if vi.type.WhichOneof("value") != "tensor_type":
            raise OperatorError(f"{path}: input '{vi.name}' is not a tensor")
        dims = _dims(vi)
        if vi.name in requested:
            want = requested[vi.name]
            if dims is not None and len(dims) != len(want):
                raise OperatorError(f"{spelling.entry(vi.name, want)}: the model's input "
                                    f"'{vi.name}' has rank {len(dims)}, not {len(want)}")
            for i, (have, new) in enumerate(zip(dims or [], want)):
                if isinstance(have, int) and have != new:
                    raise OperatorError(f"{spelling.entry(vi.name, want)}: dimension {i} of "
                                        f"'{vi.name}' is fixed to {have} in the model")
            shape = vi.type.tensor_type.shape
            del shape.dim[:]
            for d in want:
                shape.dim.add().dim_value = d
            dims = list(want)
        elif dims is None or any(not isinstance(d, int) for d in dims):
            unfixed.append((vi.name, dims))
            continue
        fixed.append((vi.name, tuple(dims), int(vi.type.tensor_type.elem_type)))
    if unfixed:
        raise OperatorError(_dynamic_input_message(path, model, unfixed, spelling))
    return fixed


def _dynamic_input_message(path: Path, model, unfixed: list, spelling: ShapeSpelling) -> str:
    """One line for inputs --input-shape left dynamic, with an --input-shape hint that works when
    pasted: every dynamic dimension gets a concrete size (SUGGESTED_SIZES, the first with which
    every inferred tensor shape is positive), and the dimensions so filled are named."""
    name, dims = unfixed[0]
    shown = "unknown rank" if dims is None else "x".join(str(d) if d else "?" for d in dims)
    head = f"{path}: input '{name}' has a dynamic shape ({shown})"
    if len(unfixed) > 1:
        head += f" (and {len(unfixed) - 1} more: {', '.join(repr(n) for n, _ in unfixed[1:])})"
    unknown = [n for n, d in unfixed if d is None]
    if unknown:
        example = spelling.fix({unknown[0]: (1, 3, 224, 224)})
        return (f"{head}; give the full shape of {', '.join(repr(n) for n in unknown)} with {spelling.option} "
                f"(e.g. {example} for an image batch)")
    suggestion = _suggest_sizes(model, unfixed)
    flags = spelling.fix(suggestion)
    named = "; ".join(("" if len(unfixed) == 1 else f"{n}: ") + ", ".join(f"{d or f'dimension {i}'}={shape[i]}"
                                           for i, d in enumerate(dims) if not isinstance(d, int))
                      for (n, dims), shape in zip(unfixed, suggestion.values()))
    return f"{head}; fix it with {flags} (suggested {named}; use the sizes you run)"


SUGGESTED_SIZES = (1, 16, 64, 224)   # for dynamic dimensions after the first (the batch, always 1)


def _suggest_sizes(model, unfixed: list) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for the dynamic inputs: the batch (dimension 0) 1, the other dynamic
    dimensions the first of SUGGESTED_SIZES with which shape inference gives every tensor a
    positive size (the smallest otherwise)."""
    import onnx
    from onnx import shape_inference

    def fill(size: int) -> dict[str, tuple[int, ...]]:
        return {n: tuple(d if isinstance(d, int) else (1 if i == 0 else size) for i, d in enumerate(dims))
                for n, dims in unfixed}

    for size in SUGGESTED_SIZES:
        shapes = fill(size)
        trial = onnx.ModelProto()
        trial.CopyFrom(model)
        for vi in trial.graph.input:
            if vi.name in shapes:
                dim = vi.type.tensor_type.shape.dim
                del dim[:]
                for d in shapes[vi.name]:
                    dim.add().dim_value = d
        try:
            inferred = shape_inference.infer_shapes(trial, check_type=True, strict_mode=True, data_prop=True)
        except Exception:
            continue
        infos = (*inferred.graph.value_info, *inferred.graph.output)
        if all(d.dim_value > 0 for vi in infos if vi.type.WhichOneof("value") == "tensor_type"
               for d in vi.type.tensor_type.shape.dim if d.HasField("dim_value")):
            return shapes
    return fill(SUGGESTED_SIZES[0])


def is_folded_cast(node, constants: Mapping[str, np.ndarray]) -> bool:
    """A default-domain Cast of a constant: its output is a constant, computed when the model is
    loaded (so the node is not a step of the network; mapping.py leaves it out like Constant)."""
    return (node.op_type == "Cast" and node.domain in ("", "ai.onnx") and len(node.input) == 1
            and len(node.output) == 1 and node.input[0] in constants)


def _constants(path: Path, model, opset: int) -> dict[str, np.ndarray]:
    from onnx import numpy_helper
    consts = {}
    for t in model.graph.initializer:
        try:
            consts[t.name] = numpy_helper.to_array(t)
        except Exception as exc:
            raise OperatorError(f"{path}: initializer '{t.name}' cannot be read: {_one_line(exc)}") from None
    # Constant nodes, Identity nodes of constants (exporters write one Identity per duplicate
    # initializer, e.g. torch for the equal BatchNorm biases of a fresh network) and Cast nodes of
    # constants (fp16 weights cast to fp32: folded here, as onnx.reference casts them), in graph order.
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "Identity" and node.input and node.input[0] in consts:
            consts[node.output[0]] = consts[node.input[0]]
        elif is_folded_cast(node, consts):
            from .nodes import run_node
            try:
                (value,) = run_node(node, {node.input[0]: consts[node.input[0]]}, opset)
            except Exception as exc:
                raise OperatorError(f"{path}: Cast node '{node.name or node.output[0]}' of constant "
                                    f"'{node.input[0]}' cannot be evaluated: {_one_line(exc)}") from None
            consts[node.output[0]] = np.asarray(value)
        elif node.op_type == "Constant":
            from .nodes import run_node
            try:
                (value,) = run_node(node, {}, opset)
            except Exception as exc:
                raise OperatorError(f"{path}: Constant node '{node.name or node.output[0]}' cannot be "
                                    f"evaluated: {_one_line(exc)}") from None
            consts[node.output[0]] = np.asarray(value)
    return consts


POOLS_WITH_CEIL_MODE = ("MaxPool", "AveragePool", "LpPool")


def _drop_padding_windows(path, model, shape_of) -> bool:
    """ONNX's shape inference for the pooling schemas before opset 22 (onnx 1.23) sizes a ceil_mode
    output without the operator's rule that a window starting in the end padding is dropped (a 4 x 16
    plane pooled 2 x 3, strides 2, pads [0, 0, 0, 2]: 9 columns, where the operator, onnx.reference and
    onnxruntime give 8). The first such node (graph order; the shapes after it change) is rewritten
    to the same windows in floor mode: ceil_mode 0 and each axis's end padding set to what its last
    window reaches (cut, or grown where a ceil window reaches past it). Padding never wins a max, adds
    nothing to an Lp norm and is not counted by an average without count_include_pad; an average that
    counts it keeps its divisors only if no end padding grows, else the node is refused. True when a
    node changed."""
    from onnx import helper
    from .onnx_nodes import pool_extent
    for node in model.graph.node:
        if node.op_type not in POOLS_WITH_CEIL_MODE or node.domain not in ("", "ai.onnx"):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        auto = attrs.get("auto_pad", b"NOTSET")
        if int(attrs.get("ceil_mode", 0)) != 1 or (auto.decode() if isinstance(auto, bytes) else str(auto)) \
                not in ("NOTSET", ""):
            continue
        shape = shape_of(node.input[0])
        if shape is None or len(shape) < 3:
            continue
        spatial, rank = list(shape[2:]), len(shape) - 2
        kernel = list(attrs["kernel_shape"])
        strides = list(attrs.get("strides", [1] * rank))
        dilations = list(attrs.get("dilations", [1] * rank))
        pads = list(attrs.get("pads", [0] * 2 * rank))
        ends, dropped = list(pads), False
        for i, size in enumerate(spatial):
            reach = (kernel[i] - 1) * dilations[i] + 1
            out = pool_extent(size, kernel[i], strides[i], dilations[i], pads[i], pads[i + rank], 1)
            dropped = dropped or out < -(-(size + pads[i] + pads[i + rank] - reach) // strides[i]) + 1
            ends[i + rank] = max(0, (out - 1) * strides[i] - pads[i] + reach - size)
        if not dropped:
            continue
        counts_pads = node.op_type == "AveragePool" and int(attrs.get("count_include_pad", 0))
        if counts_pads and any(ends[i + rank] > pads[i + rank] for i in range(rank)):
            raise OperatorError(f"{path}: node '{node.name or node.output[0]}' (AveragePool, ceil_mode=1, "
                                f"count_include_pad=1): a window would start in the end padding on one axis while "
                                f"another needs ceil mode; ONNX's shape inference sizes it wrong and no floor-mode "
                                f"node keeps its divisors: not supported")
        kept = [a for a in node.attribute if a.name not in ("pads", "ceil_mode")]
        del node.attribute[:]
        node.attribute.extend(kept)
        node.attribute.extend([helper.make_attribute("pads", ends), helper.make_attribute("ceil_mode", 0)])
        return True
    return False


def _forget_declared_shapes(model) -> None:
    """Drop the model's declarations of the shapes past its inputs (value_info, graph outputs)."""
    del model.graph.value_info[:]
    for out in model.graph.output:
        if out.type.WhichOneof("value") == "tensor_type":
            out.type.tensor_type.ClearField("shape")


def _static_shapes(model) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for vi in (*model.graph.input, *model.graph.value_info, *model.graph.output):
        dims = _dims(vi)
        if dims is not None and all(isinstance(d, int) for d in dims):
            shapes[vi.name] = tuple(dims)
    return shapes


def infer_shapes(model, path="model"):
    """ONNX shape inference (strict), with pooling nodes whose ceil-mode windows would start in the
    end padding rewritten first (_drop_padding_windows): a copy, inferred again after each rewrite
    (which changes the shapes after it); after a rewrite the model's declared shapes past its inputs
    give way to the operators' (onnxruntime, too, runs such a model to the operators' shapes and
    warns). `model` itself is not changed; a model without a ceil-mode pool is inferred once."""
    import onnx
    from onnx import shape_inference

    def infer(m):
        return shape_inference.infer_shapes(m, check_type=True, strict_mode=True, data_prop=True)

    if not any(n.op_type in POOLS_WITH_CEIL_MODE and any(a.name == "ceil_mode" and a.i == 1 for a in n.attribute)
               for n in model.graph.node):
        return infer(model)
    work = onnx.ModelProto()
    work.CopyFrom(model)
    rewritten = False
    while True:
        # the shapes as ONNX infers them, without the model's own declarations past its inputs (a
        # declaration made right for the operator would conflict with the inference)
        probe = onnx.ModelProto()
        probe.CopyFrom(work)
        _forget_declared_shapes(probe)
        shapes = _static_shapes(infer(probe))
        if not _drop_padding_windows(path, work, shapes.get):
            break
        rewritten = True
    if rewritten:   # declarations past the inputs were likely made by the same inference: the operators decide
        _forget_declared_shapes(work)
    return infer(work)


def model_label(model) -> str:
    """How messages name a model given as an onnx.ModelProto rather than a file."""
    graph = model.graph.name
    return f"onnx.ModelProto (graph '{graph}')" if graph else "onnx.ModelProto"


def is_model_proto(model) -> bool:
    import onnx
    return isinstance(model, onnx.ModelProto)


def _from_proto(model):
    """A copy of an in-memory model (the loader fixes input shapes in place: never the caller's)."""
    import onnx
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    if not copy.graph.node and not copy.graph.output:
        raise OperatorError(f"{model_label(model)}: not an ONNX model (no graph)")
    return copy


def load_model(source, input_shapes: Optional[dict] = None, spelling: ShapeSpelling = CLI_SHAPES) -> LoadedModel:
    """Read, check and shape-infer `source`, an ONNX file or an onnx.ModelProto (messages name the
    file, or the proto by its graph: model_label); input_shapes from parse_input_shapes (or the
    API's, checked alike: spelling says how the user gave them)."""
    import onnx
    from onnx import shape_inference
    if is_model_proto(source):
        path = model_label(source)      # the name messages and the report give the model
        model = _from_proto(source)
    else:
        path = Path(source)
        model = _read(path)
    opset = _opset(path, model)
    try:
        onnx.checker.check_model(model)
    except Exception as exc:
        raise OperatorError(f"{path}: the ONNX checker rejects the model: {_one_line(exc)}") from None
    inputs = _fix_inputs(path, model, input_shapes or {}, spelling)
    try:
        model = infer_shapes(model, path)
    except OperatorError:
        raise
    except Exception as exc:
        raise OperatorError(f"{path}: shape inference fails: {_one_line(exc)}") from None
    shapes, types = {}, {}
    for vi in (*model.graph.input, *model.graph.value_info, *model.graph.output):
        dims = _dims(vi)
        shapes[vi.name] = tuple(dims) if dims is not None and all(isinstance(d, int) for d in dims) else None
        if vi.type.WhichOneof("value") == "tensor_type":
            types[vi.name] = int(vi.type.tensor_type.elem_type)
    constants = _constants(path, model, opset)
    for name, value in constants.items():
        shapes[name] = tuple(value.shape)
    for t in model.graph.initializer:
        types[t.name] = int(t.data_type)
    return LoadedModel(path=str(path), model=model, opset=opset, inputs=tuple(inputs),
                       outputs=tuple(o.name for o in model.graph.output), constants=constants,
                       shapes=shapes, types=types)
