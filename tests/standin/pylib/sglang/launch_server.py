"""`python -m sglang.launch_server ...`: runs the stand-in engine in SGLang mode."""
import os
import sys

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    standin = os.path.normpath(os.path.join(here, "..", ".."))
    sys.path.insert(0, standin)
    sys.dont_write_bytecode = True
    import engine

    sys.exit(engine.main(["sglang"] + sys.argv[1:]))
