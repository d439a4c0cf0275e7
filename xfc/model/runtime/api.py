"""`xfc.compile_model`: a whole network as a Python callable at C speed.

The same sources as `xfc model --emit lib` (lower.py or, for a quantized model, quantized_program.py;
emit.py), compiled for this machine into a
shared library and loaded with ctypes (xfc.runners.hostnet.HostNetwork): one C call per inference,
the inputs' memory passed as it is, the outputs written by C into fresh arrays.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional

from ...errors import OperatorError
from ..library import abi_for, select_toolchain
from ..load import API_SHAPES, is_model_proto, load_model
from .emit import build_shared, compile_objects, render_network, write_sources
from .network import kernel_names, lower_and_synthesize


def compile_network(model, hw, *, threads: Optional[int] = None, input_shapes: Optional[dict] = None,
                    cluster: Optional[str] = None, out_dir=None, force: bool = False, name: Optional[str] = None):
    """model: an ONNX file or an onnx.ModelProto; hw: an x86-64 description (this machine). Returns a
    HostNetwork. out_dir: keep the sources and the shared library there (an xfc output directory;
    force: beside files xfc did not write); default: a temporary directory, removed once the library
    is loaded. Messages name the arguments as xfc.compile_model's (input_shapes=, out_dir, force=True)."""
    from ...outputs import API_OUTPUT_NAMES, OutputDir
    from ...runners.hostnet import HostNetwork
    if hw.target_arch != "x86_64":
        raise OperatorError(f"compile_model runs the network in this process: {hw.name} is not this machine "
                            f"(use `xfc model NET --hw {hw.name} --emit lib` for its library)")
    with tempfile.TemporaryDirectory(prefix="xfc-network-") as tmp:
        tmp = Path(tmp)
        if is_model_proto(model):     # loaded as it is: messages name it by its graph
            stem = name or (model.graph.name or "model")
        elif isinstance(model, (str, os.PathLike)):
            model = Path(model)
            stem = name or model.stem
        else:
            raise OperatorError(f"model must be an ONNX file path or an onnx.ModelProto, got {type(model).__name__}")
        lowered, syntheses = lower_and_synthesize(load_model(model, input_shapes, API_SHAPES), stem, hw,
                                                  cluster=cluster, threads=threads)
        program = lowered.program
        keys = program.distinct_kernels()
        default_threads = threads or hw.cluster(cluster).count
        rendered = render_network(program, syntheses, kernel_names(keys), hw, stem, default_threads=default_threads,
                                  cluster=cluster)
        tools = select_toolchain(abi_for(hw), {})

        def build(directory: Path) -> Path:
            write_sources(rendered, directory)
            objects = compile_objects(rendered, directory, tmp / "obj", tools)
            return build_shared(rendered, objects, directory / f"lib{rendered.prefix}.so", tools)

        if out_dir is None:
            (tmp / "build").mkdir()
            library = build(tmp / "build")   # loaded before the directory goes: the mapping outlives the file
            return HostNetwork(library, rendered.prefix, rendered.weights, default_threads, stem)
        with OutputDir(Path(out_dir), what=f"xfc.compile_model {stem} for {hw.name}", force=force,
                       **API_OUTPUT_NAMES) as staging:
            library = build(staging.path)
            staging.commit()
        return HostNetwork(Path(out_dir) / library.name, rendered.prefix, rendered.weights, default_threads, stem)
