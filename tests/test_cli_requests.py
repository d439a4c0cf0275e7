"""Bad values of `xfc synth` options and the text output of `xfc hw show`: one line, exit 2,
nothing written; shared formatting of what the command line prints (issue 35's smaller items)."""
from __future__ import annotations

from pathlib import Path

import pytest

from xfc.cli import main
from xfc.errors import OperatorError
from xfc.hardware.load import load as load_hw
from xfc.tiledb.locations import resolve

pytestmark = pytest.mark.unit

MATMUL = ["synth", "matmul", "--hw", "snapdragon-865", "--shape", "m=4,n=4,k=4"]


def run(argv, capsys):
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code, out, err, *needles):
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xfc: error: ") and "Traceback" not in out + err, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_tile_db_path_that_does_not_exist_is_exit_2(tmp_path, capsys):
    missing = tmp_path / "nope.sqlite"
    out_dir = tmp_path / "out"
    code, out, err = run(MATMUL + ["--tile-db", str(missing), "-o", str(out_dir)], capsys)
    assert_one_line_error(code, out, err, f"--tile-db {missing}", "no such file")
    assert not out_dir.exists()


def test_tile_db_auto_off_and_existing_paths_still_resolve(tmp_path):
    hw = load_hw("snapdragon-865")
    env = {"XFC_CACHE_DIR": str(tmp_path / "cache")}
    assert resolve("off", hw, env) is None
    assert resolve("auto", hw, env) is not None            # shipped or per-user: need not exist yet
    present = tmp_path / "mine.sqlite"
    present.write_bytes(b"not a database")                 # exists: the evaluator warns about it, not resolve
    assert resolve(str(present), hw, env) == Path(present)
    with pytest.raises(OperatorError, match="no such file"):
        resolve(str(tmp_path / "nope.sqlite"), hw, env)


@pytest.mark.parametrize("value", ["0", "-3"])
@pytest.mark.parametrize("command", [MATMUL, ["bench", "matmul", "--hw", "cortex-a76", "--shape", "m=4,n=4,k=4",
                                              "--device", "qemu"]], ids=["synth", "bench"])
def test_repeat_below_one_is_exit_2_like_bench(tmp_path, capsys, command, value):
    out_dir = tmp_path / "out"
    code, out, err = run(command + ["--bench", "--repeat", value, "-o", str(out_dir)] if command[0] == "synth"
                         else command + ["--repeat", value], capsys)
    assert_one_line_error(code, out, err, f"--repeat must be >= 1, got {value}")
    assert not out_dir.exists()
