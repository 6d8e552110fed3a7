"""The config a trace keeps in its meta is bounded (:data:`CONFIG_KEPT_CHARS`, nesting
:data:`CONFIG_KEPT_DEPTH`), so every trace the tool writes, the tool opens: a model whose
config is megabytes of JSON, nested past the loader's limit or past Python's recursion,
or keyed by tuples, is traced, written and opened, with what was left out named."""

from __future__ import annotations

import json

import pytest

import tracing
from app.cli import main
from tracing.capture.structure import config_dict

MODEL = """
import torch
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 4)
        self.config = CONFIG
    def forward(self, x):
        return self.l(x)
"""


def _deep(depth: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(depth):
        value = {"d": value}
    return value


CONFIGS = {
    "megabytes": "{'hidden': 4, **{f'k{i}': 'x' * 100 for i in range(30_000)}}",
    "nested past the loader's 64": f"{_deep(100)!r}",
    "nested past recursion": "DEEP",
    "tuple keys": "{(1, 2): 'pair', 'hidden': 4}",
}


@pytest.mark.parametrize("name", CONFIGS)
def test_every_trace_written_opens(tmp_path, capsys, name):
    config = CONFIGS[name]
    source = MODEL.replace("CONFIG", config)
    if config == "DEEP":
        source = "d = {'leaf': 1}\nfor _ in range(5000):\n    d = {'d': d}\n" + MODEL.replace(
            "CONFIG", "d"
        )
    (tmp_path / "m.py").write_text(source)
    out = tmp_path / "t.sft"
    argv = ["trace", "--model", f"{tmp_path / 'm.py'}:Net", "--input-shape", "2,4"]
    assert main([*argv, "--input-dtype", "float", "--quiet", "-o", str(out)]) == 0
    capsys.readouterr()
    kept = tracing.load(out).meta["config"]
    assert len(json.dumps(kept, separators=(",", ":"))) <= 2**20  # CONFIG_KEPT_CHARS
    assert main(["report", str(out), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["meta"]["config"] == kept
    if name == "megabytes":
        assert kept["hidden"] == 4 and "keys are not kept" in kept["__cut__"]
    if name == "tuple keys":
        assert kept == {"(1, 2)": "pair", "hidden": 4}


def test_a_config_within_the_bounds_is_kept_whole():
    config = {"n_layer": 12, "rope": {"type": "linear", "factor": [1.0, 2.0]}, "name": "x"}
    assert config_dict(config) == config
