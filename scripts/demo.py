"""The README's main job (`make demo`): synthesize a conv2d for a phone and for this machine.

1. snapdragon.yaml (big cluster): synthesize, cross-compile with aarch64-linux-gnu-gcc and
   verify against numpy under qemu-aarch64 (emulated: correctness only, not phone speed).
2. host: synthesize, build natively, verify and time it.
"""
import sys

from xfc.cli import main

CONV = ["--shape", "c=64,h=56,w=56,k=64,r=3,s=3", "--pad", "1", "--bias", "--activation", "relu"]

steps = [
    ("conv2d for snapdragon.yaml, verified under qemu-aarch64",
     ["synth", "conv2d", "--hw", "snapdragon.yaml", *CONV, "--verify", "--explain"]),
    ("conv2d for this machine (host), verified and timed natively",
     ["synth", "conv2d", "--hw", "host", *CONV, "--verify", "--bench", "--threads", "1"]),
]
for title, argv in steps:
    print(f"\n=== {title} ===\n$ xfc {' '.join(argv)}", flush=True)
    status = main(argv)
    if status:
        sys.exit(status)
print("\nDone. Try 'xfc hw list', 'xfc synth --help', and the README for more.")
