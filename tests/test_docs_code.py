"""The documentation's code runs: a documented call that breaks fails here.

- every ```python block of README.md and docs/*.md, each in a fresh process in an empty
  folder (a block must be self-contained; only one whose first line is a comment saying it
  ``needs the internet`` is left out);
- every script in examples/ (with the small argument it documents);
- every ``tracing.<name>`` (dotted too) that the README, the docs or a docstring under
  tracing/ and app/ writes resolves after a bare ``import tracing``;
- every ``scratchformer <command>`` in a ```bash block is a real subcommand.

Each block's process is forked from a Python that has imported torch and nothing else
(``helpers/warm_runner.py``): no other block, test or fixture ran in it, and the suite does
not pay for ``import torch`` fifteen times. They run two at a time, once per suite run: the
xdist workers share the results (``runs``).
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.once import shared_folder

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NEEDS_INTERNET = re.compile(r"#.*needs the internet", re.I)
#: examples/ scripts and the arguments that keep them small and headless
EXAMPLES = {
    "heatmap_demo.py": ["--screenshot", "heatmap.png"],
    "nan_loss.py": ["nan_step.trace"],
}
TIMEOUT_S = 120
#: documented names whose module has not landed yet, and where it will come from; a name
#: here that resolves fails the test, so the list only shrinks
PENDING: dict[str, str] = {}


def fenced(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def python_blocks() -> list[tuple[str, str]]:
    """``(page:n, code)`` of every Python block that can run offline."""
    blocks = []
    for page in PAGES:
        for n, code in enumerate(fenced(page.read_text(encoding="utf-8"), "python"), 1):
            first = code.lstrip().splitlines()[0] if code.strip() else ""
            if not NEEDS_INTERNET.match(first):
                blocks.append((f"{page.relative_to(ROOT)}:{n}", code))
    return blocks


def _env() -> dict[str, str]:
    # a block that opens the app (``tracing.show``) really opens it, offscreen, and the
    # window closes itself after it showed its trace (``app.commands.app._quit_after``)
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", OMP_NUM_THREADS="1")
    env["SCRATCHFORMER_QUIT_AFTER_MS"] = "300"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    """``code`` run by a fresh Python at the repository's root, and checked to exit 0."""
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result


class _WarmRunner:
    """One ``helpers/warm_runner.py`` server: each job a fresh process forked from a
    Python that has imported torch and nothing else (see that module)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "helpers" / "warm_runner.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env(),
        )  # fmt: skip

    def run(self, job: dict) -> subprocess.CompletedProcess:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({**job, "timeout": TIMEOUT_S}) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        return subprocess.CompletedProcess(job, reply["rc"], reply["stdout"], reply["stderr"])

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Every block and example, run once per suite run (two at a time), by name: the
    tests reading them may land on different xdist workers, which share the results
    (``helpers/once.py``); each result is still the block's own fresh process."""

    def fill(folder: Path) -> None:
        done = _run_every_block(tmp_path_factory)
        fields = ("args", "returncode", "stdout", "stderr")
        saved = {n: {f: getattr(r, f) for f in fields} for n, r in done.items()}
        (folder / "runs.json").write_text(json.dumps(saved), encoding="utf-8")

    results = shared_folder(tmp_path_factory, "docs_code_runs", fill) / "runs.json"
    saved = json.loads(results.read_text(encoding="utf-8"))
    return {name: subprocess.CompletedProcess(**r) for name, r in saved.items()}


def _run_every_block(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    jobs = {name: {"code": code} for name, code in python_blocks()}
    for script, args in EXAMPLES.items():
        jobs[f"examples/{script}"] = {"script": str(ROOT / "examples" / script), "argv": args}
    base = tmp_path_factory.mktemp("docs_code")
    for name, job in jobs.items():
        folder = base / re.sub(r"\W", "_", name)
        folder.mkdir(parents=True)
        job["cwd"] = str(folder)
    runners = [_WarmRunner(), _WarmRunner()]
    free: queue.Queue = queue.Queue()
    for r in runners:
        free.put(r)

    def run(job: dict) -> subprocess.CompletedProcess:
        runner = free.get()
        try:
            return runner.run(job)
        finally:
            free.put(runner)

    try:
        with ThreadPoolExecutor(max_workers=len(runners)) as pool:
            futures = {name: pool.submit(run, job) for name, job in jobs.items()}
            return {name: f.result() for name, f in futures.items()}
    finally:
        for r in runners:
            r.close()


def test_docs_have_python_blocks_and_the_internet_ones_are_marked() -> None:
    names = [name for name, _ in python_blocks()]
    assert len(names) >= 8, names
    for page in PAGES:
        for code in fenced(page.read_text(encoding="utf-8"), "python"):
            if "from_pretrained" in code:  # downloads: must say so on its first line
                assert NEEDS_INTERNET.match(code.lstrip().splitlines()[0]), code


def test_a_block_that_shows_a_model_opens_the_app_on_it(runs) -> None:
    calls = re.compile(r"^[^#\n]*tracing\.show\(", re.M)  # a call, not a comment naming it
    code = dict(python_blocks())
    shown = {n: r for n, r in runs.items() if calls.search(code.get(n, ""))}
    assert shown, "no documented tracing.show block"
    for name, r in shown.items():
        assert "shown: step" in r.stdout, (name, r.stdout[-500:], r.stderr[-1500:])


def test_every_python_block_runs(runs) -> None:
    failed = {
        name: r.stderr[-2000:]
        for name, r in runs.items()
        if not name.startswith("examples/") and r.returncode != 0
    }
    assert not failed, "\n\n".join(f"--- {n}\n{err}" for n, err in failed.items())


def test_every_example_runs(runs) -> None:
    scripts = sorted(p.name for p in (ROOT / "examples").glob("*.py"))
    assert scripts == sorted(EXAMPLES), "give every example its small arguments in EXAMPLES"
    failed = {
        name: r.stderr[-2000:]
        for name, r in runs.items()
        if name.startswith("examples/") and r.returncode != 0
    }
    assert not failed, "\n\n".join(f"--- {n}\n{err}" for n, err in failed.items())


def documented_tracing_names() -> set[str]:
    texts = [p.read_text(encoding="utf-8") for p in PAGES]
    for folder in ("tracing", "app"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            texts.append(path.read_text(encoding="utf-8"))
    pattern = re.compile(r"(?<![\w./])tracing((?:\.[A-Za-z_]\w*)+)")
    return {m.group(1)[1:] for text in texts for m in pattern.finditer(text)}


def test_every_documented_tracing_name_resolves_after_a_bare_import() -> None:
    import tracing

    names = sorted(documented_tracing_names() | set(tracing.__all__) | set(PENDING))
    assert "breakpoints.NonFinite" in names and "patching.sweep" in names
    # one fresh interpreter, each name from a bare import's facade (getattr chain)
    code = (
        "import sys, tracing\n"
        "bad = []\n"
        "for name in sys.argv[1:]:\n"
        "    obj = tracing\n"
        "    for part in name.split('.'):\n"
        "        if part == 'py':\n"
        "            break  # a file name (tracing/show_app.py written with dots)\n"
        "        try:\n"
        "            obj = getattr(obj, part)\n"
        "        except (AttributeError, ImportError):\n"
        "            bad.append(name)\n"
        "            break\n"
        "print('\\n'.join(bad))\n"
    )
    result = _python(code, *names)
    bad = set(result.stdout.split())
    assert not bad - set(PENDING), f"do not resolve after `import tracing`: {sorted(bad)}"
    assert not set(PENDING) - bad, f"resolve now, drop from PENDING: {sorted(set(PENDING) - bad)}"


def documented_commands() -> set[str]:
    commands = set()
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in fenced(text, "bash") + fenced(text, ""):
            commands.update(re.findall(r"(?:scratchformer|-m app\.cli) ([a-z][a-z-]*)", block))
    return commands


def test_every_documented_command_is_a_real_subcommand() -> None:
    commands = sorted(documented_commands())
    assert {"app", "trace", "report"} <= set(commands), commands
    code = (
        "import sys, contextlib, io\n"
        "from app.cli import main\n"
        "bad = []\n"
        "for cmd in sys.argv[1:]:\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"  # noqa: E501
        "        try:\n"
        "            code = main([cmd, '--help'])\n"
        "        except SystemExit as e:\n"
        "            code = e.code\n"
        "    if code not in (0, None):\n"
        "        bad.append(cmd)\n"
        "print(' '.join(bad))\n"
    )
    result = _python(code, *commands)
    assert not result.stdout.strip(), f"not `scratchformer` subcommands: {result.stdout}"


def test_the_dims_page_lists_every_letter_of_the_table() -> None:
    """docs/dims.md's letter table and tracing.dims.letters.LETTERS say the same."""
    from tracing.dims.letters import LETTERS

    page = (ROOT / "docs" / "dims.md").read_text(encoding="utf-8")
    table = page.split("\n## The letters\n", 1)[1].split("\n## ", 1)[0]  # not a sample's
    rows = re.findall(r"^\| `([^`]+)` \| (.+?) \|", table, flags=re.M)
    assert [letter for letter, _ in rows] == list(LETTERS)
    assert all(meaning == LETTERS[letter].meaning for letter, meaning in rows)
