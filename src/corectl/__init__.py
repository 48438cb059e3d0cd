"""corectl: turn standalone DGX nodes into one Slurm GPU cluster, and keep it healthy."""

__version__ = "0.1.0"
