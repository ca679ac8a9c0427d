"""Capture on GPU nodes: ``perfdoctor capture -- torchrun train.py`` (nsys + per-rank hook + manifest).

Imports nothing beyond the standard library (and torch/nvtx inside training processes): this code
runs inside training jobs, where pandas and friends may be absent or cost start-up time.
"""
