"""The per-rank capture hook: loaded into every Python process of a captured run by ``pythonpath/sitecustomize.py``."""
