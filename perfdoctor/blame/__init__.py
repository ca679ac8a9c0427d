"""What blocked the step: dependency graph → critical path across ranks → every ns to one cause (DESIGN §3
"Exposed is not blocking").

- :mod:`~perfdoctor.blame.causes`: the cause names, and what the host was doing in an interval;
- :mod:`~perfdoctor.blame.graph`: the device ops of one rank and their dependency edges, as columns;
- :mod:`~perfdoctor.blame.path`: each step walked back from its end along the binding edge, per rank;
- :mod:`~perfdoctor.blame.join`: the ranks' paths joined at the collective rendezvous (wait vs transfer);
- :mod:`~perfdoctor.blame.whatif`: the step re-walked with the edges a knob acts on shortened.
"""
