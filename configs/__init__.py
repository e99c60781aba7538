"""The shipped configs, installed as the `imgrec_configs` package so `--config=local` works from any folder."""
