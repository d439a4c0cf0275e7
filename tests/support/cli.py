"""The `xfc` command line run in the test process."""
from __future__ import annotations

from xfc.cli import main


def run(argv, capfd):
    """main(argv) in-process: (exit code, stdout, stderr); argparse errors exit through SystemExit.
    capfd: captures what the command line and its child processes write at the file-descriptor level."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capfd.readouterr()
    return code, out, err


def assert_one_line_error(code, err, status, *needles):
    """The command failed with exit `status` and one line on stderr, `xfc: error: ...` holding every needle."""
    assert code == status, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xfc: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
