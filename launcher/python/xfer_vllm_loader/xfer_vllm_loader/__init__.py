"""vLLM load format ``xfer``: each rank loads a safetensors shard as soon as
the xfer agent of its own node has verified it and placed it under its final
name, in the order the shards arrive.

vLLM runs ``register`` in every process (the ``vllm.general_plugins`` entry
point); it only adds the load format (and, for a rank ``xfer-launch up``
started held, waits until its preflight passed, and one worker per node
then meets the preflight's rendezvous), so a vLLM started without
``--load-format xfer`` or the agent's ``XFER_HOLD_FILE`` behaves as if the
plugin were not installed. What the
loader trusts and the environment it reads are in ``agent.py``.
"""

_registered = False


def register() -> None:
    """Adds ``--load-format xfer`` to vLLM's model-loader registry (once a
    process; vLLM may call it more than once). A rank started held
    (``XFER_HOLD_FILE``) first waits here to be released; once released,
    one vLLM worker per node meets the preflight's rendezvous here
    (``XFER_RENDEZVOUS``), before the engine's own distributed init."""
    global _registered
    if _registered:
        return
    from vllm.logger import init_logger

    from .agent import meet_for_preflight, wait_for_release

    logger = init_logger("vllm.xfer_loader")

    def log(line: str) -> None:
        logger.info("%s", line)

    wait_for_release(log=log)
    meet_for_preflight(log=log)
    from vllm.model_executor.model_loader import register_model_loader

    from .loader import XferModelLoader

    register_model_loader("xfer")(XferModelLoader)
    _registered = True
