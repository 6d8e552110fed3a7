"""The wheel's packages, found rather than listed (everything else is in pyproject.toml).

Every package under ``app/``, ``scratchformer/`` and ``tracing/`` is found, so a new
subpackage cannot be left out; the top-level ``resources/`` folder (the bundled demo
checkpoint) installs as ``scratchformer.resources`` (``package-dir`` in pyproject.toml).
"""

from setuptools import find_packages, setup

FOUND = find_packages(include=["app", "app.*", "scratchformer", "scratchformer.*", "tracing*"])
setup(packages=[*FOUND, "scratchformer.resources"])
