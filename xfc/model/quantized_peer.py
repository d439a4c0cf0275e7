"""onnxruntime as the int8 peer of xfc/model/quantized.py: quantize an fp32 model the way users do
(onnxruntime.quantization.quantize_static after its pre-processing, a small random calibration set)
and read onnxruntime's value of every tensor a step of a QuantizedNetwork writes. Used by
tests/test_quantized_models.py and benchmarks/int8_oracle.py; onnxruntime is the test and benchmark
dependency it always was, imported here only when called."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

CALIBRATION_INPUTS = 4


def quantize_with_onnxruntime(src: Path, out: Path, fmt: str, *, reduce_range: bool = True,
                              activation: str = "uint8", per_channel: bool = True, seed: int = 0) -> Path:
    """src (fp32 ONNX) quantized into out: fmt 'qdq' or 'qoperator', int8 weights (7-bit with
    reduce_range, which onnxruntime's u8 x s8 kernels on x86 without VNNI sum exactly), uint8 or int8
    activations, per-channel or per-tensor weight scales. Symbolic shape inference is skipped (it
    needs sympy, which xfc does not install); onnx's shape inference is enough for these models."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process
    x = onnx.load(str(src)).graph.input[0]
    shape = [d.dim_value for d in x.type.tensor_type.shape.dim]

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(seed)
            self.batches = iter([{x.name: rng.standard_normal(shape).astype(np.float32)}
                                 for _ in range(CALIBRATION_INPUTS)])

        def get_next(self):
            return next(self.batches, None)

    with tempfile.TemporaryDirectory(prefix="xfc-quantize-") as tmp:   # the pre-processed model: ours, dropped
        pre = Path(tmp) / "pre.onnx"
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        quantize_static(str(pre), str(out), Reader(),
                        quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
                        per_channel=per_channel, reduce_range=reduce_range,
                        activation_type=QuantType.QUInt8 if activation == "uint8" else QuantType.QInt8,
                        weight_type=QuantType.QInt8)
    return Path(out)


def onnxruntime_step_values(path: Path, network, feeds, optimize: bool = True) -> dict:
    """onnxruntime's value of every tensor a step of the network writes (each made a graph output).
    optimize False: the graph computed as written (a QDQ graph in fp32, no int8 kernels)."""
    import onnx
    import onnxruntime as ort
    from onnx import helper
    model = onnx.load(str(path))
    known = {o.name for o in model.graph.output}
    for step in network.steps:
        if step.outputs[0] not in known:
            model.graph.output.append(helper.make_empty_tensor_value_info(step.outputs[0]))
    options = ort.SessionOptions()
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
