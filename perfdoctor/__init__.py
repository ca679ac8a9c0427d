"""perfdoctor: why is this Megatron/NeMo training run slow, and which knob fixes it.

The package is one pipeline, each stage a subpackage: ``load`` (nsys SQLite → Timelines),
``classify`` (kernel taxonomy, parallel groups), ``measure`` (metrics as pure functions),
``diagnose`` (rules), ``render`` (terminal, JSON, HTML, Markdown). ``api`` strings them together.
Heavy libraries (pandas, pyarrow, plotly) are imported lazily so that ``perfdoctor --help`` is fast.
"""

__version__ = "0.1.0"
