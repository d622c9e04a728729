"""Stand-in `sglang` package (see tests/standin/README.md)."""
import os

__version__ = os.environ.get("STANDIN_VERSION") or "0.5.4"
