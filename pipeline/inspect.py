"""`python -m pipeline.inspect OUTPUT`: the name this command had first; see pipeline/verify.py."""
import sys

from pipeline.verify import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m pipeline.inspect"))
