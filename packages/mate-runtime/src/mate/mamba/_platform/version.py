"""The version of mate-runtime (one home: the package, the CLI and the kernel store read it)."""

__version__ = "0.1.0"
