"""The ddops host agent: stdlib only, Python >= 3.8. See remote/README.md for its layout and protocol.

The bootstrap (remote/bootstrap.py) imports every module of this package from the shipped bundle; the verbs
register themselves in protocol.VERBS as their modules are imported."""
