"""xfc's version (a leaf: modules read it here, never from the package face)."""
__version__ = "0.1.0"
