"""`xfc synth`: placeholder until the synthesizer lands."""


def register(sub):
    pass
