"""Differential fuzzing of generated kernels: cases, their random generation and their shrinking.

Pure. A case (FuzzCase) is a frozen dataclass that round-trips through JSON. Case `index` of
seed `seed` is a deterministic function of (seed, index, targets, hardware pool): drawing 10 or
10,000 cases gives the same first ten. Shrinking takes the predicate that runs a case as an
argument, so it is tested with fakes. Running a case lives in xfc.testing.fuzz_run, the command line
(`xfc fuzz`) in xfc.cli.fuzz.

Sizes are biased toward the values where kernels break: 1, primes, powers of two +/- 1 and the
values around the register tile (lanes, MR, NR, the k unroll); a few cases get one long
dimension that crosses the KC / MC / NC cache blocks. Every case stays under MAX_MACS
multiply-adds so that it runs in about a second, also under qemu.
"""
from __future__ import annotations

import random
import shlex
from dataclasses import dataclass, fields, replace
from typing import Callable, Iterable, Iterator, Mapping, Optional, Sequence

from ..errors import OperatorError, XfcError
from ..cpu.isa import ISA_TABLE
from ..ops.spec import ACTIVATIONS, OPERATORS, SHAPE_KEYS, make_spec

CASE_FORMAT = 1
TARGETS = ("host", "qemu", "pocl")
# What failed, from the most to the least specific; 'pass' is the only other status.
FAILURE_CLASSES = ("wrong", "crash", "timeout", "build", "rejected", "error")
CPU_ISAS = ("avx512", "avx2", "neon", "generic")
DTYPES = ("fp32", "fp16", "int8")       # CPU: fp16 on ARM cores with FP16 arithmetic (qemu), int8 on x86 hosts
                                        # and ARM cores with dotprod; PoCL: fp32 and fp16 (fp16 storage)
GPU_LANE_HINTS = (4, 8, 16, 32)          # work-group widths and vector widths of the OpenCL kernels
MAX_MACS = 1 << 22                       # multiply-adds per case (about 0.1 s under qemu)
PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97,
          101, 103, 127, 131, 197, 257, 509, 1021)
MICRO_TILE_ROWS = (4, 6, 8, 12, 14, 16)  # MR values the synthesizer picks on the shipped cores
WINDOW_SIZES = (1, 1, 1, 2, 3, 3, 3, 4, 5, 7)
BATCH_KEY = {"matmul": "batch", "conv2d": "n", "depthwise": "n"}


# ---------------------------------------------------------------------------------------------
# The case.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FuzzCase:
    """One kernel request and how to run it. Geometry fields are ignored (kept at 1/0) for matmul."""

    target: str                              # 'host' (native gcc), 'qemu' (aarch64 under qemu), 'pocl'
    op: str                                  # one of xfc.ops.OPERATORS
    dims: tuple[tuple[str, int], ...]        # operator sizes without the batch, e.g. (('m', 5), ...)
    batch: int = 1                           # matmul batch / conv and depthwise N
    stride: tuple[int, int] = (1, 1)
    pad: tuple[int, int, int, int] = (0, 0, 0, 0)   # top, left, bottom, right
    dilation: tuple[int, int] = (1, 1)
    bias: bool = False
    activation: str = "none"
    hw: str = "host"                         # 'host' or a shipped description ('snapdragon-865', 'snapdragon.yaml')
    cluster: Optional[str] = None            # CPU cluster role on a SoC; None: the default / not a CPU target
    threads: Optional[int] = None            # CPU targets only
    isa: str = ""                            # CPU: avx512, avx2, neon or generic; '' for pocl
    dtype: str = "fp32"                      # fp32, fp16 or int8 (pocl: fp16 storage, fp32 arithmetic)
    seed: int = 0                            # seed of the input data (xfc.ops.dtypes.make_operands)
    quant: str = ""                          # int8: quantization as `--quant` takes it ('' the defaults)
    label: str = ""                          # where it came from, e.g. 's1-c42' (not part of the request)

    @property
    def shape(self) -> dict[str, int]:
        return {**dict(self.dims), BATCH_KEY[self.op]: self.batch}

    @property
    def windowed(self) -> bool:
        return self.op != "matmul"

    def spec(self):
        """The validated OperatorSpec (OperatorError if the case asks for an invalid one)."""
        if self.windowed:
            return make_spec(self.op, self.shape, stride=self.stride, pad=self.pad, dilation=self.dilation,
                             bias=self.bias, activation=self.activation)
        return make_spec(self.op, self.shape, bias=self.bias, activation=self.activation)

    def macs(self) -> int:
        return self.spec().flops // 2

    def describe(self) -> str:
        parts = [self.target, self.hw + (f"/{self.cluster}" if self.cluster else "")]
        if self.target == "pocl":
            parts.append(self.dtype)
        else:
            parts += [self.isa, f"t{self.threads}"] + ([self.dtype] if self.dtype != "fp32" else [])
            if self.quant:
                parts.append(f"quant={self.quant}")
        parts.append(self.op)
        parts.append(",".join(f"{k}={v}" for k, v in self.shape.items()))
        if self.windowed:
            parts.append(f"stride={self.stride[0]},{self.stride[1]} pad={','.join(map(str, self.pad))} "
                         f"dilation={self.dilation[0]},{self.dilation[1]}")
        epi = "+".join((["bias"] if self.bias else []) + ([self.activation] if self.activation != "none" else []))
        parts.append(f"epilogue={epi or 'none'}")
        parts.append(f"seed={self.seed}")
        return " ".join(parts)

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "dims":
                value = dict(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    @staticmethod
    def from_dict(data, where: str = "case") -> "FuzzCase":
        """Check every field (one-line OperatorError naming where/field/value) and build the case."""
        if not isinstance(data, dict):
            raise OperatorError(f"{where}: expected a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(FuzzCase)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise OperatorError(f"{where}: unknown field '{unknown[0]}'")
        for name in ("target", "op", "dims"):
            if name not in data:
                raise OperatorError(f"{where}: field '{name}' is missing")

        def fail(name, why):
            return OperatorError(f"{where}: field '{name}'={data.get(name)!r} {why}")

        def integer(name, value, minimum):
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise fail(name, f"must be an integer >= {minimum}")
            return value

        def ints(name, length, minimum):
            value = data.get(name, [1] * length if minimum else [0] * length)
            if not isinstance(value, list) or len(value) != length:
                raise fail(name, f"must be a list of {length} integers")
            return tuple(integer(name, v, minimum) for v in value)

        target, op = data["target"], data["op"]
        if target not in TARGETS:
            raise fail("target", f"must be one of {', '.join(TARGETS)}")
        if op not in OPERATORS:
            raise fail("op", f"must be one of {', '.join(OPERATORS)}")
        dims = data["dims"]
        required, _ = SHAPE_KEYS[op]
        if not isinstance(dims, dict) or sorted(dims) != sorted(required):
            raise fail("dims", f"must be an object with exactly the keys {', '.join(required)}")
        dims = tuple((k, integer("dims", dims[k], 1)) for k in required)
        activation = data.get("activation", "none")
        if activation not in ACTIVATIONS:
            raise fail("activation", f"must be one of {', '.join(ACTIVATIONS)}")
        bias = data.get("bias", False)
        if not isinstance(bias, bool):
            raise fail("bias", "must be true or false")
        threads = data.get("threads")
        if threads is not None:
            integer("threads", threads, 1)
        isa, dtype = data.get("isa", ""), data.get("dtype", "fp32")
        if target == "pocl":
            if isa:
                raise fail("isa", "must be empty for target pocl")
            if dtype not in ("fp32", "fp16"):
                raise fail("dtype", "must be fp32 or fp16")
        else:
            allowed = ("avx512", "avx2", "generic") if target == "host" else ("neon", "generic")
            if isa not in allowed:
                raise fail("isa", f"must be one of {', '.join(allowed)} for target {target}")
            if dtype not in DTYPES:
                raise fail("dtype", f"must be one of {', '.join(DTYPES)}")
            if dtype == "fp16" and (target != "qemu" or isa != "neon"):
                raise fail("dtype", "fp16 CPU cases run on ARM cores: target qemu, isa neon")
            if dtype == "int8" and target == "qemu" and isa != "neon":
                raise fail("isa", "must be neon for an ARM int8 case (sdot / smmla)")
            if threads is None:
                raise fail("threads", f"is required for target {target}")
        quant = data.get("quant", "")
        if not isinstance(quant, str) or (quant and dtype != "int8"):
            raise fail("quant", "must be a `--quant` string, and only for dtype int8")
        if quant:
            from ..ops.quant import parse_quant
            try:
                parse_quant(quant)
            except OperatorError as exc:
                raise OperatorError(f"{where}: field 'quant': {exc}") from None
        for name in ("hw", "label"):
            if not isinstance(data.get(name, ""), str):
                raise fail(name, "must be a string")
        cluster = data.get("cluster")
        if cluster is not None and cluster not in ("prime", "big", "mid", "little"):
            raise fail("cluster", "must be null or one of prime, big, mid, little")
        case = FuzzCase(target=target, op=op, dims=dims, batch=integer("batch", data.get("batch", 1), 1),
                        stride=ints("stride", 2, 1), pad=ints("pad", 4, 0), dilation=ints("dilation", 2, 1),
                        bias=bias, activation=activation, hw=data.get("hw", "host") or "host", cluster=cluster,
                        threads=threads, isa=isa, dtype=dtype, seed=integer("seed", data.get("seed", 0), 0),
                        quant=quant, label=data.get("label", ""))
        try:
            case.spec()
        except OperatorError as exc:
            raise OperatorError(f"{where}: {exc}") from None
        return case

    # -- reproduction ------------------------------------------------------------------------

    def synth_argv(self, native_host_isa: str = "") -> Optional[list[str]]:
        """The `xfc synth ... --verify` command that builds and checks the same kernel on the same
        inputs, or None when xfc synth cannot express the case (inputs seed != 0, a non-native
        host ISA, or isa generic on an ARM core)."""
        if self.seed != 0:
            return None
        if self.target == "host" and self.isa != native_host_isa:
            return None
        if self.target == "qemu" and self.isa != "neon":
            return None
        argv = ["xfc", "synth", self.op, "--hw", self.hw,
                "--shape", ",".join(f"{k}={v}" for k, v in self.shape.items())]
        if self.windowed:
            argv += ["--stride", f"{self.stride[0]},{self.stride[1]}", "--pad", ",".join(map(str, self.pad)),
                     "--dilation", f"{self.dilation[0]},{self.dilation[1]}"]
        if self.bias:
            argv.append("--bias")
        if self.activation != "none":
            argv += ["--activation", self.activation]
        if self.target == "pocl":
            argv += ["--target", "gpu", "--dtype", self.dtype]
        else:
            if self.cluster:
                argv += ["--cluster", self.cluster]
            argv += ["--threads", str(self.threads)]
            if self.dtype != "fp32":
                argv += ["--dtype", self.dtype] + (["--quant", self.quant] if self.quant else [])
        return argv + ["--verify"]


def replay_argv(path: str) -> list[str]:
    return ["xfc", "fuzz", "--replay", str(path)]


def command_text(argv: Sequence[str]) -> str:
    return shlex.join(list(argv))


# ---------------------------------------------------------------------------------------------
# The hardware the generator draws from.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HardwareChoice:
    """What generation needs to know about one description for one target."""

    target: str
    name: str                                   # as `--hw` takes it
    clusters: tuple[tuple[Optional[str], int], ...] = ()   # CPU: (role or None for the default, cores)
    isas: tuple[str, ...] = ()                  # CPU: the native ISA first, then the others to draw
    dtypes: tuple[str, ...] = ("fp32",)         # pocl: the GPU's; CPU: what every cluster runs
    cluster_dtypes: tuple[tuple[str, ...], ...] = ()   # CPU: the dtypes of each cluster (clusters' order)


def choices_from_descriptions(named: Iterable[tuple[str, object]], host=None,
                              host_isas: Sequence[str] = ()) -> dict[str, tuple[HardwareChoice, ...]]:
    """{target: choices} from (name, HardwareDescription) pairs and the host description.

    Pure: the caller loads the files. qemu gets every AArch64 description with CPU clusters,
    pocl every description with a Mali or Adreno GPU, host the host with each ISA it can run.
    """
    pool: dict[str, list[HardwareChoice]] = {t: [] for t in TARGETS}
    for name, hw in named:
        if hw.clusters and hw.target_arch == "aarch64":
            pool["qemu"].append(HardwareChoice(
                "qemu", name, clusters=tuple((c.role if len(hw.clusters) > 1 else None, c.count) for c in hw.clusters),
                isas=("neon", "generic"),
                cluster_dtypes=tuple(("fp32",) + (("fp16",) if "fp16" in c.core.features else ())
                                     + (("int8",) if "dotprod" in c.core.features else ()) for c in hw.clusters)))
        if hw.gpu is not None and hw.gpu.family in ("mali", "adreno"):
            fp16 = hw.gpu.fp16_flop_per_clock_per_cu is not None and "cl_khr_fp16" in tuple(hw.gpu.extensions)
            pool["pocl"].append(HardwareChoice("pocl", name, dtypes=("fp32", "fp16") if fp16 else ("fp32",)))
    if host is not None and host_isas:
        pool["host"].append(HardwareChoice("host", "host", clusters=((None, host.clusters[0].count),),
                                           isas=tuple(host_isas), cluster_dtypes=(("fp32", "int8"),)))
    return {t: tuple(v) for t, v in pool.items()}


def for_dtypes(pool: Mapping[str, Sequence[HardwareChoice]], dtypes: Sequence[str]) -> dict:
    """The pool restricted to the clusters (CPU) and GPUs that run at least one of dtypes, so that
    every case drawn is of a type asked for. The whole pool when every dtype is asked for."""
    if set(DTYPES) <= set(dtypes):
        return {t: tuple(v) for t, v in pool.items()}
    out: dict = {}
    for target, choices in pool.items():
        kept = []
        for c in choices:
            if target == "pocl":
                if set(c.dtypes) & set(dtypes):
                    kept.append(c)
                continue
            keep = [i for i, runs in enumerate(c.cluster_dtypes or (("fp32",),) * len(c.clusters))
                    if set(runs) & set(dtypes)]
            if keep:
                kept.append(replace(c, clusters=tuple(c.clusters[i] for i in keep),
                                    cluster_dtypes=tuple(c.cluster_dtypes[i] for i in keep) if c.cluster_dtypes else ()))
        out[target] = tuple(kept)
    return out


def select_hardware(pool: Mapping[str, Sequence[HardwareChoice]], targets: Sequence[str],
                    names: Optional[Sequence[str]] = None) -> dict[str, tuple[HardwareChoice, ...]]:
    """Restrict the pool to targets (and to names, when given); one-line error on a name or a
    target left with nothing to run."""
    for target in targets:
        if target not in TARGETS:
            raise OperatorError(f"--targets: unknown target '{target}' (expected {', '.join(TARGETS)})")
    wanted = set(names) if names else None
    if wanted is not None:
        known = {c.name for t in targets for c in pool.get(t, ())}
        missing = sorted(wanted - known)
        if missing:
            raise OperatorError(f"--hw {missing[0]}: not a description the targets {','.join(targets)} can run "
                                f"(known: {', '.join(sorted(known))})")
    out = {}
    for target in targets:
        chosen = tuple(c for c in pool.get(target, ()) if wanted is None or c.name in wanted)
        if not chosen:
            raise OperatorError(f"--targets {target}: no hardware to run it on"
                                + (" within --hw" if wanted is not None else ""))
        out[target] = chosen
    return out


# ---------------------------------------------------------------------------------------------
# Generation.
# ---------------------------------------------------------------------------------------------

def _tile_sizes(lanes_hints: Sequence[int]) -> list[int]:
    sizes = set(MICRO_TILE_ROWS)
    for lanes in lanes_hints:
        sizes.update(lanes * v for v in (1, 2, 3, 4))
    return sorted(sizes)


def draw_size(rng: random.Random, hi: int, lanes_hints: Sequence[int]) -> int:
    """A size in [1, hi] biased toward 1, primes, 2^k +/- 1 and the register-tile boundaries."""
    u = rng.random()
    if u < 0.12:
        value = 1
    elif u < 0.3:
        value = rng.choice([p for p in PRIMES if p <= hi] or [1])
    elif u < 0.48:
        value = 2 ** rng.randint(1, max(1, hi.bit_length())) + rng.choice((-1, 0, 1))
    elif u < 0.75:
        value = rng.choice(_tile_sizes(lanes_hints)) + rng.choice((-1, 0, 1))
    else:
        value = rng.randint(1, hi)
    return min(max(1, value), hi)


def _draw_threads(rng: random.Random, cores: int) -> int:
    if cores <= 1:
        return 1
    u = rng.random()
    if u < 0.3:
        return 1
    if u < 0.6:
        return cores
    return rng.randint(1, cores)


def _draw_window(rng: random.Random):
    """(r, s, stride, dilation, pad) with pads always smaller than the window extent."""
    r = rng.choice(WINDOW_SIZES)
    s = r if rng.random() < 0.5 else rng.choice(WINDOW_SIZES)
    u = rng.random()
    if u < 0.6:
        stride = (1, 1)
    elif u < 0.85:
        stride = (2, 2)
    else:
        stride = (rng.choice((1, 2, 3)), rng.choice((1, 2, 3)))
    if rng.random() < 0.75:
        dilation = (1, 1)
    else:
        dilation = (rng.choice((1, 2, 3)) if r > 1 else 1, rng.choice((1, 2, 3)) if s > 1 else 1)
    extent_h, extent_w = dilation[0] * (r - 1) + 1, dilation[1] * (s - 1) + 1
    u = rng.random()
    if u < 0.4:
        pad = (0, 0, 0, 0)
    elif u < 0.7:  # 'same'-like, symmetric
        pad = ((extent_h - 1) // 2, (extent_w - 1) // 2, (extent_h - 1) // 2, (extent_w - 1) // 2)
    else:  # asymmetric, each side anywhere below the extent
        pad = (rng.randint(0, extent_h - 1), rng.randint(0, extent_w - 1),
               rng.randint(0, extent_h - 1), rng.randint(0, extent_w - 1))
    return r, s, stride, dilation, pad


def _min_input(extent: int, pad_a: int, pad_b: int) -> int:
    return max(1, extent - pad_a - pad_b)


def _fit_budget(case: FuzzCase, budget: int, keep: str = "") -> FuzzCase:
    """Halve the largest reducible size (`keep` last) until the case is under budget multiply-adds.
    Window sizes are never reduced here."""
    while case.macs() > budget:
        dims = dict(case.dims)
        sizes = {k: v for k, v in dims.items() if k not in ("r", "s")}
        if case.windowed:
            ext_h = case.dilation[0] * (dims["r"] - 1) + 1
            ext_w = case.dilation[1] * (dims["s"] - 1) + 1
            floors = {"h": _min_input(ext_h, case.pad[0], case.pad[2]), "w": _min_input(ext_w, case.pad[1], case.pad[3])}
        else:
            floors = {}
        sizes["_batch"] = case.batch
        reducible = {k: v for k, v in sizes.items() if v > floors.get(k, 1)}
        if not reducible:
            return case
        key = max(reducible, key=lambda k: (k != keep, reducible[k], k))
        new = max(floors.get(key, 1), reducible[key] // 2)
        if key == "_batch":
            case = replace(case, batch=new)
        else:
            dims[key] = new
            case = replace(case, dims=tuple(dims.items()))
    return case


def generate_case(seed: int, index: int, pool: Mapping[str, Sequence[HardwareChoice]],
                  targets: Sequence[str], budget: int = MAX_MACS, dtypes: Sequence[str] = DTYPES) -> FuzzCase:
    """Case `index` of `seed`: deterministic, valid (make_spec accepts it), under `budget` MACs.
    dtypes: the element types to draw from (each case one the hardware runs); the dtype and the int8
    quantization come from a random stream of their own, so a case's geometry does not depend on it."""
    rng = random.Random(f"xfc-fuzz:{seed}:{index}")
    target = targets[index % len(targets)]
    hw = rng.choice(list(pool[target]))
    cluster, threads, isa, dtype, quant = None, None, "", "fp32", ""
    if target == "pocl":
        if "fp16" in hw.dtypes:   # the draw is taken whatever dtypes asks, so the geometry after it is too
            drawn_fp16 = rng.random() < 0.3
            dtype = "fp16" if "fp16" in dtypes and (drawn_fp16 or "fp32" not in dtypes) else "fp32"
        lanes = GPU_LANE_HINTS
    else:
        index_in_hw = rng.randrange(len(hw.clusters))
        cluster, cores = hw.clusters[index_in_hw]
        isa = hw.isas[0] if rng.random() < 0.7 or len(hw.isas) == 1 else rng.choice(hw.isas[1:])
        threads = _draw_threads(rng, cores)
        lanes = (ISA_TABLE[isa].hand_lanes,)   # the dialect's fp32 lanes (xfc/cpu/isa.py)
    op = rng.choice(OPERATORS)
    long_dim = rng.random() < 0.12       # one dimension may run long: crosses KC / MC / NC blocks
    long_key = ""
    batch = 1 if rng.random() < 0.7 else rng.randint(2, 4)
    stride, pad, dilation = (1, 1), (0, 0, 0, 0), (1, 1)
    if op == "matmul":
        caps = {"m": 160, "n": 160, "k": 300}
        if long_dim:
            long_key = rng.choice(("m", "n", "k"))
            caps[long_key] = 2048
        dims = {key: draw_size(rng, cap, lanes) for key, cap in caps.items()}
        if long_key and rng.random() < 0.6:  # really long: past the MC / NC blocks of most plans
            dims[long_key] = rng.randint(caps[long_key] // 4, caps[long_key])
    else:
        r, s, stride, dilation, pad = _draw_window(rng)
        caps = {"c": 20, "h": 28, "w": 28, "k": 40} if op == "conv2d" else {"c": 32, "h": 40, "w": 40}
        if long_dim:
            long_key = rng.choice(sorted(caps))
            caps[long_key] = {"c": 128, "h": 96, "w": 96, "k": 160}[long_key]
        dims = {key: draw_size(rng, cap, lanes) for key, cap in caps.items()}
        if long_key and rng.random() < 0.6:
            dims[long_key] = rng.randint(caps[long_key] // 4, caps[long_key])
        ext_h, ext_w = dilation[0] * (r - 1) + 1, dilation[1] * (s - 1) + 1
        dims["h"] = max(dims["h"], _min_input(ext_h, pad[0], pad[2]))
        dims["w"] = max(dims["w"], _min_input(ext_w, pad[1], pad[3]))
        dims.update(r=r, s=s)
    order = SHAPE_KEYS[op][0]
    if target != "pocl":
        runs = [d for d in dtypes if d in (hw.cluster_dtypes[index_in_hw] if hw.cluster_dtypes else ("fp32",))]
        drng = random.Random(f"xfc-fuzz-dtype:{seed}:{index}")
        dtype = drng.choice(runs) if runs else "fp32"
        if dtype != "fp32" and target == "qemu":
            isa = "neon"                    # fp16 (FMLA .8h) and int8 (sdot / smmla) are NEON kernels
        if dtype == "int8":
            quant = _draw_quant(drng)
    case = FuzzCase(target=target, op=op, dims=tuple((k, dims[k]) for k in order), batch=batch,
                    stride=stride, pad=pad, dilation=dilation, bias=rng.random() < 0.5,
                    activation=rng.choice(ACTIVATIONS), hw=hw.name, cluster=cluster, threads=threads, isa=isa,
                    dtype=dtype, seed=rng.randrange(1 << 31), quant=quant, label=f"s{seed}-c{index}")
    return _fit_budget(case, budget, keep=long_key)


def _draw_quant(rng: random.Random) -> str:
    """int8 quantization as `--quant` takes it: both activation types, zero points at the ends of
    their range, in the middle and anywhere, per-tensor or per-channel weight scales."""
    act = rng.choice(("uint8", "int8"))
    lo, hi = (0, 255) if act == "uint8" else (-128, 127)

    def zero_point():
        u = rng.random()
        return lo if u < 0.2 else hi if u < 0.4 else (lo + hi + 1) // 2 if u < 0.6 else rng.randint(lo, hi)
    return f"act={act},a_zp={zero_point()},per_channel={int(rng.random() < 0.5)},out_zp={zero_point()}"


def generate_cases(seed: int, pool: Mapping[str, Sequence[HardwareChoice]], targets: Sequence[str],
                   count: Optional[int] = None, start: int = 0, dtypes: Sequence[str] = DTYPES) -> Iterator[FuzzCase]:
    """Cases start, start+1, ... (forever when count is None)."""
    index = start
    while count is None or index < start + count:
        yield generate_case(seed, index, pool, targets, dtypes=dtypes)
        index += 1


# ---------------------------------------------------------------------------------------------
# Shrinking.
# ---------------------------------------------------------------------------------------------

def _smaller(value: int, floor: int = 1) -> list[int]:
    """Candidate replacements for value, most aggressive first."""
    out = []
    for v in (floor, floor + 1, value // 2, value - 1):
        if floor <= v < value and v not in out:
            out.append(v)
    return out


def _valid(case: FuzzCase) -> bool:
    try:
        case.spec()
    except XfcError:
        return False
    return True


def complexity(case: FuzzCase) -> int:
    """What shrinking decreases: every size, stride, pad and dilation, plus one for each extra
    (inputs seed, fp16, bias, activation). Every candidate is strictly below its parent."""
    return (sum(v for _, v in case.dims) + case.batch + sum(case.stride) + sum(case.pad) + sum(case.dilation)
            + (case.threads or 0) + case.bias + (case.activation != "none") + (case.seed != 0)
            + (case.dtype != "fp32") + bool(case.quant))


def _axis_geometry(case: FuzzCase, axis: int, *, window: Optional[int] = None, dilation: Optional[int] = None,
                   pads: Optional[tuple[int, int]] = None) -> FuzzCase:
    """case with one axis (0: rows, 1: columns) of the window changed; the input grows to the
    smallest size the new window fits, if it has to."""
    dims = dict(case.dims)
    win_key, in_key = ("r", "h") if axis == 0 else ("s", "w")
    if window is not None:
        dims[win_key] = window
    dil = list(case.dilation)
    if dilation is not None:
        dil[axis] = dilation
    pad = list(case.pad)
    if pads is not None:
        pad[axis], pad[axis + 2] = pads
    extent = dil[axis] * (dims[win_key] - 1) + 1
    dims[in_key] = max(dims[in_key], _min_input(extent, pad[axis], pad[axis + 2]))
    return replace(case, dims=tuple((k, dims[k]) for k, _ in case.dims), dilation=tuple(dil), pad=tuple(pad))


def shrink_candidates(case: FuzzCase) -> Iterator[FuzzCase]:
    """Valid cases that are each strictly simpler than case (see complexity), in the order worth
    trying first: inputs seed 0, plain fp32, no epilogue, one thread, batch 1, plain window
    geometry, then every size toward 1 (window sizes last: they bound the pads). Window changes
    that only fit together (a smaller dilation and smaller pads) are also tried together."""
    def with_dim(key, value):
        return replace(case, dims=tuple((k, value if k == key else v) for k, v in case.dims))

    def swap(values, index, value):
        return tuple(value if i == index else x for i, x in enumerate(values))

    raw: list[FuzzCase] = []
    if case.seed != 0:
        raw.append(replace(case, seed=0))
    if case.quant:
        raw.append(replace(case, quant=""))
    if case.dtype != "fp32":
        raw.append(replace(case, dtype="fp32", quant=""))
    if case.bias:
        raw.append(replace(case, bias=False))
    if case.activation != "none":
        raw.append(replace(case, activation="none"))
    if case.threads is not None:
        raw += [replace(case, threads=v) for v in _smaller(case.threads)]
    raw += [replace(case, batch=v) for v in _smaller(case.batch)]
    if case.windowed:
        for axis in (0, 1):
            raw += [replace(case, stride=swap(case.stride, axis, v)) for v in _smaller(case.stride[axis])]
            raw += [replace(case, dilation=swap(case.dilation, axis, v)) for v in _smaller(case.dilation[axis])]
            raw += [_axis_geometry(case, axis, dilation=1, pads=(0, 0)), _axis_geometry(case, axis, pads=(0, 0))]
        for side in range(4):
            raw += [replace(case, pad=swap(case.pad, side, v)) for v in _smaller(case.pad[side], floor=0)]
    window = ("r", "s")
    for key, value in [(k, v) for k, v in case.dims if k not in window] + \
                      [(k, v) for k, v in case.dims if k in window]:
        for v in _smaller(value):
            raw.append(with_dim(key, v))
            if key in window:  # a smaller window may need smaller pads and dilation: drop them together
                axis = window.index(key)
                raw.append(_axis_geometry(case, axis, window=v, pads=(0, 0)))
                raw.append(_axis_geometry(case, axis, window=v, dilation=1, pads=(0, 0)))
    seen, limit = {case}, complexity(case)
    for cand in raw:
        if cand not in seen and complexity(cand) < limit and _valid(cand):
            seen.add(cand)
            yield cand


@dataclass(frozen=True)
class ShrinkResult:
    case: FuzzCase
    attempts: int       # candidate cases run
    steps: int          # candidates accepted (each one strictly simpler)


def shrink(case: FuzzCase, still_fails: Callable[[Sequence[FuzzCase]], Sequence[bool]],
           max_attempts: int = 200, batch_size: int = 1) -> ShrinkResult:
    """Greedy shrinking: take the first candidate (in shrink_candidates order) that still fails,
    repeat from it until no candidate fails or max_attempts candidates have been run.

    still_fails gets up to batch_size candidates at a time (so a caller can run them in parallel)
    and answers for each; the result does not depend on batch_size.
    """
    current, attempts, steps = case, 0, 0
    while attempts < max_attempts:
        candidates = list(shrink_candidates(current))
        accepted = None
        for start in range(0, len(candidates), batch_size):
            chunk = candidates[start:start + min(batch_size, max_attempts - attempts)]
            if not chunk:
                break
            verdicts = list(still_fails(chunk))
            attempts += len(chunk)
            accepted = next((c for c, bad in zip(chunk, verdicts) if bad), None)
            if accepted is not None or attempts >= max_attempts:
                break
        if accepted is None:
            break
        current, steps = accepted, steps + 1
    return ShrinkResult(case=current, attempts=attempts, steps=steps)
