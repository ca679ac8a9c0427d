"""Tests that run a real Nsight Systems CLI, and the helpers they share (capture.py)."""
