"""Diagnose: rules (rules/*.yaml + ``--rules DIR``) evaluated over the measurements → findings with knobs."""

from perfdoctor.diagnose.findings import diagnose, evaluate_rules
from perfdoctor.diagnose.rules import Rule, RuleError, load_rules

__all__ = ["Rule", "RuleError", "diagnose", "evaluate_rules", "load_rules"]
