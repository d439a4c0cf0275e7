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
