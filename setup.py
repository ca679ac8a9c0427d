"""Package list for setuptools (everything else is in pyproject.toml).

``find_packages`` cannot map the top-level ``rules/`` folder into the package, so it is added here as
``perfdoctor.rules``; tests/test_packaging.py checks that the built wheel holds every module and rule.
"""

from setuptools import find_namespace_packages, setup

setup(
    packages=[*find_namespace_packages(include=["perfdoctor", "perfdoctor.*"]), "perfdoctor.rules"],
    package_dir={"perfdoctor.rules": "rules"},
)
