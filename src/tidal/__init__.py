"""tidal: elastic, multi-job training on a shared pool of GPUs."""

__version__ = "0.1.0"
