"""``--model`` takes a Hugging Face folder, a config.json alone, or FILE.py:NAME: one
loader (``app.core.model_sources``), checked against transformers' and tokenizers' own results."""

from __future__ import annotations

import json
import sys

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from helpers.hf_folders import llama_folder, tiny_llama_config, train_tokenizer

from app.cli import main
from app.core.model_sources import SourceSpec, load
from app.core.user_model import InputSpec, UserCodeError

PROMPT = "hello world, the cat sat"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return llama_folder(tmp_path_factory.mktemp("tiny-llama"))


def test_folder_loads_the_saved_weights_and_its_tokenizer(folder):
    import transformers
    from tokenizers import Tokenizer

    loaded = load(str(folder), InputSpec(prompt=PROMPT))
    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(PROMPT).ids
    assert loaded.meta["tokens"] == ids and ids[0] == 0  # its BOS, as the file says
    assert loaded.args[0].tolist() == [ids]
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = reference(torch.tensor([ids])).logits
        got = loaded.model(*loaded.args).logits
    assert torch.equal(got, expected)
    labels = loaded.meta["token_labels"]
    assert labels[0] == "<s>" and "".join(labels[1:]) == PROMPT
    assert loaded.meta["source"] == "hf_folder"


def test_trace_command_on_a_folder_keeps_the_token_strings(folder, tmp_path, capsys):
    import tracing

    out = tmp_path / "t.sft"
    code = main(["trace", "--model", str(folder), "--prompt", PROMPT, "-o", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err
    trace = tracing.load(out)
    assert "".join(trace.meta["token_labels"][1:]) == PROMPT
    assert len(trace.attention_maps()) == 2


def test_a_saved_trace_names_any_token_after_its_tokenizer_is_gone(folder, tmp_path):
    """Every id, predicted ones too, carries the tokenizer's text in the file: with the
    tokenizer.json deleted, the namer still gives each one."""
    import shutil

    from tokenizers import Tokenizer

    import tracing
    from tracing.token_names import text_label, token_namer

    copy = shutil.copytree(folder, tmp_path / "model")
    out = tmp_path / "t.sft"
    args = ["trace", "--model", str(copy), "--prompt", "the cat", "-o", str(out), "--quiet"]
    assert main(args) == 0
    tok = Tokenizer.from_file(str(copy / "tokenizer.json"))
    (copy / "tokenizer.json").unlink()
    name = token_namer(tracing.load(out).meta)
    anchor = tok.token_to_id("t")
    checked = 0
    for i in range(tok.get_vocab_size()):
        before = tok.decode([anchor])
        text = tok.decode([anchor, i], skip_special_tokens=False)[len(before) :]
        if "\ufffd" not in text and i > 1:
            assert name(i) == text_label(text)
            checked += 1
    assert checked > 150


def test_the_report_spells_the_prompt_as_the_tokenizer_split_it(folder, tmp_path, capsys):
    """``report`` of a folder model's trace: the prompt's tokens as their strings (a model
    of ours keeps its byte report: no such line)."""
    import json

    from tokenizers import Tokenizer

    out = tmp_path / "t.sft"
    assert (
        main(["trace", "--model", str(folder), "--prompt", PROMPT, "-o", str(out), "--quiet"]) == 0
    )
    assert main(["report", str(out), "--format", "json", "-o", str(tmp_path / "r.json")]) == 0
    summary = json.loads((tmp_path / "r.json").read_text())["summary"]
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    split = tok.encode(PROMPT).tokens
    assert [s.replace("␣", "Ġ") for s in summary["token_strings"][-len(split) :]] == split
    assert main(["report", str(out), "--format", "md", "-o", str(tmp_path / "r.md")]) == 0
    assert (
        "**token strings**: " + " ".join(summary["token_strings"])
        in (tmp_path / "r.md").read_text()
    )
    demo = tmp_path / "demo.sft"
    assert main(["trace", "-o", str(demo), "--quiet"]) == 0
    assert main(["report", str(demo), "--format", "md", "-o", str(tmp_path / "d.md")]) == 0
    assert "token strings" not in (tmp_path / "d.md").read_text()


def test_config_alone_builds_random_weights_and_traces_on_meta(folder, tmp_path, capsys):
    import tracing

    config = tmp_path / "config.json"
    config.write_text((folder / "config.json").read_text())
    loaded = load(str(config), InputSpec(shape=(1, 8)), device="cpu", seed=3)
    assert loaded.meta["weights"] == "random" and loaded.model(*loaded.args).logits.shape == (
        1,
        8,
        300,
    )
    out = tmp_path / "meta.sft"
    args = ["trace", "--model", str(config), "--device", "meta", "--input-shape", "1,2048"]
    assert main([*args, "--capture", "shapes", "-o", str(out), "--quiet"]) == 0
    trace = tracing.load(out)
    maps = [r for r in trace.tensors if r.role == "attention"]
    assert [tuple(r.shape) for r in maps] == [(1, 4, 2048, 2048)] * 2
    assert any("meta device" in n for n in trace.meta["notes"])


def test_pickle_weights_are_refused_naming_safetensors(tmp_path, capsys):
    import transformers

    folder = tmp_path / "pickled"
    folder.mkdir()
    model = transformers.LlamaForCausalLM(tiny_llama_config())
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    code = main(["trace", "--model", str(folder), "-o", str(tmp_path / "x.sft")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error:")
    assert "pytorch_model.bin" in err and "weights_only" in err and "safetensors" in err


def test_without_transformers_one_line_says_how_to_install(folder, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises
    code = main(["trace", "--model", str(folder), "-o", str(tmp_path / "x.sft")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert 'pip install "scratchformer[hf]"' in err


def test_file_model_takes_a_tokenizer(tmp_path):
    tok = train_tokenizer(tmp_path / "tokenizer.json")
    file = tmp_path / "m.py"
    file.write_text(
        "import torch.nn as nn\n"
        "class M(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.emb = nn.Embedding(300, 8)\n"
        "    def forward(self, x):\n"
        "        return self.emb(x)\n"
    )
    loaded = load(f"{file}:M", InputSpec(prompt="the dog"), tokenizer=tok)
    from tokenizers import Tokenizer

    assert loaded.meta["tokens"] == Tokenizer.from_file(str(tok)).encode("the dog").ids
    assert "".join(loaded.meta["token_labels"][1:]) == "the dog"
    plain = load(f"{file}:M", InputSpec(prompt="ab"))  # no tokenizer: bytes
    assert plain.meta["tokens"] == [97, 98]


def test_a_bad_model_text_is_one_clear_error(tmp_path):
    with pytest.raises(UserCodeError, match="no such folder or file"):
        SourceSpec.parse(str(tmp_path / "nothing"))
    (tmp_path / "c.json").write_text(json.dumps({"hidden_size": 3}))
    with pytest.raises(UserCodeError, match="no model_type"):
        load(str(tmp_path / "c.json"))


def test_generate_with_a_folder_matches_transformers_greedy(folder, capsys):
    import transformers
    from tokenizers import Tokenizer

    code = main(
        ["generate", "--model", str(folder), "--prompt", "the cat", "--temperature", "0",
         "--max-new-tokens", "5"]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out.strip()
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.tensor([tok.encode("the cat").ids])
    with torch.no_grad():
        for _ in range(5):  # greedy, by hand: the independent reference
            nxt = reference(ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], 1)
    assert printed == tok.decode(ids[0].tolist(), skip_special_tokens=False)


def test_patch_with_a_folder_sweeps_its_heads(folder, tmp_path, capsys):
    out = tmp_path / "heads.csv"
    code = main(
        ["patch", "--model", str(folder), "--clean", "the cat sat", "--corrupted",
         "the dog sat", "-o", str(out), "--quiet"]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    rows = out.read_text().strip().splitlines()
    assert len(rows) == 1 + 2  # a header, one row per layer (4 heads a row)


def test_the_app_session_traces_a_folder_with_its_tokens(folder):
    from app.core.session import ModelSource, TraceRequest, run_trace

    source = ModelSource("file", model=str(folder))
    outcome = run_trace(TraceRequest(prompt=PROMPT, source=source, capture="values"))
    assert outcome.status == "complete", outcome.message
    from tracing.token_names import prompt_labels, token_namer

    labels = prompt_labels(outcome.trace.meta)
    assert labels[0] == "<s>" and "".join(labels[1:]).replace("␣", " ") == PROMPT
    name = token_namer(outcome.trace.meta)  # any id, a predicted one too
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert name(tok.token_to_id("Ġdog")) == "␣dog"  # not in the prompt: from the file

    from app.panels.retrace import request_for

    again = request_for(outcome.trace)
    assert again is not None and again.source.model == str(folder)
