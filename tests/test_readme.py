"""The README promises two set-up commands; CI must run exactly the test one."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```(?:bash|sh)\n(.*?)```", text, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_ci_runs_the_readme_test_command() -> None:
    ci_lines = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    test_command = ci_lines[-1]
    assert "pytest" in test_command
    assert test_command in readme_commands()


def test_readme_app_command_installs_torch_cpu_first_and_runs_the_app() -> None:
    app_commands = [c for c in readme_commands() if c.endswith("scratchformer app")]
    assert app_commands, "README must show one command that installs and runs the app"
    command = app_commands[0]
    assert command.index("torch==2.13.0") < command.index("pip install -e .")
