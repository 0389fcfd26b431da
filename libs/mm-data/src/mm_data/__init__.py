"""Video/image + caption datasets (PyAV), buckets, a layout-independent stateful sampler, and the latent cache."""

__version__ = "0.1.0"
