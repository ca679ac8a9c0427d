"""perfdoctor: why is this Megatron/NeMo training run slow, and which knob fixes it.

The package is one pipeline, each stage a subpackage: ``load`` (nsys SQLite → Timelines),
``classify`` (kernel taxonomy, parallel groups), ``measure`` (metrics as pure functions),
``diagnose`` (rules), ``render`` (terminal, JSON, HTML, Markdown). ``api`` strings them together.
Event tables are numpy columns (``table``), not pandas; the heavy libraries that remain (connectorx for
large SQLite tables, plotly for HTML) are imported only when the input or output needs them.
"""

__version__ = "0.1.0"
