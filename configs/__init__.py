"""The shipped configs, installed as the `imgrec.configs` package so `--config=seed` works from any folder."""
