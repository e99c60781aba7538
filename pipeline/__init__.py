"""imgrec pipeline: options, the composite transform, publishing and reading back."""
__version__ = "0.4.2"
