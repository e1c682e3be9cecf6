"""raysweep's version, in a module of its own so that the stages read it without importing the package's face
(`raysweep/__init__.py` loads the Python API on first use)."""

__version__ = "0.1.0"
