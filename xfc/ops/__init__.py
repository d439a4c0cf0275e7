"""Input 2: operator specifications, and the truth kernels are checked against.

  spec.py       MatmulSpec / Conv2dSpec / DepthwiseSpec, parse_shape, make_spec, gemm_view, window_rows
  reference.py  deterministic inputs, the float64 oracle, the K-derived error bound, check_output
                (fp32) and the fp16-storage check
  accuracy.py   the verdict: worst-case bound and the statistical (RMS) limit, derived
  workloads.py  the suite shared by tests, benchmarks and the tile database

The names below are the package's face (the oracle itself is reference.reference: the module keeps
its name); xfc's own modules import from the submodules.
"""
from .reference import check_output, make_inputs
from .spec import (ACTIVATIONS, OPERATORS, Conv2dSpec, DepthwiseSpec, Epilogue, MatmulSpec, OperatorSpec, gemm_view,
                   make_spec, parse_shape)

__all__ = ["ACTIVATIONS", "OPERATORS", "Conv2dSpec", "DepthwiseSpec", "Epilogue", "MatmulSpec", "OperatorSpec",
           "check_output", "gemm_view", "make_inputs", "make_spec", "parse_shape"]
