"""SparseLift: profile, analyze and optimize the sparse path of TorchRec training."""

__version__ = "0.1.0"
