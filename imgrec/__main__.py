"""`python -m imgrec COMMAND ...`: the `imgrec` command."""
from pipeline.cli import entry_point

if __name__ == "__main__":
    entry_point()
