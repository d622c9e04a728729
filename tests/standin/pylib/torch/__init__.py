"""The stand-in's `torch`: a version only, so that the launcher's version
probe of torch (asked through the engine's Python) has something to read.
It has no `torch.distributed`, so the rendezvous probe says it is skipped."""

__version__ = "2.13.0"
