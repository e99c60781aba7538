"""`python -m pipeline.inspect OUTPUT`: the name this command had first; see pipeline/verify.py."""
from pipeline.standard_streams import open_closed_standard_streams

if __name__ == "__main__":
    open_closed_standard_streams()  # as pipeline.verify does when run itself: before TensorFlow's import

from pipeline.interrupts import exit_quietly
from pipeline.verify import main

if __name__ == "__main__":
    exit_quietly(main(prog="python -m pipeline.inspect"))
