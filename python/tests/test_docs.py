"""Every example the documentation shows runs as written: README.md and docs/*.md (but
docs/queries.md, whose SQL python/tests/test_parquet.py runs).

- ```python blocks run in a fresh temporary directory holding a copy of ``fixtures/``, with this
  interpreter (Chainer's in the one ``POOLSIGHT_CHAINER_PYTHON`` names). A block that needs a
  package that is not installed is skipped with the reason. Every trace a block leaves there
  must read back whole (``poolsight info``: exit 0, no warning).
- ```console blocks: each ``$ `` line is a command (a trailing ``\\`` continues it), the lines
  after it up to the next ``$ `` are what it prints (stdout, then stderr), compared after
  :func:`normalise`. A command must exit 0 unless it ends with a ``# exit N`` comment.
- ```sh blocks: each line that is not blank or a comment is a command (``\\`` continues it), run
  for its exit status (0, or the ``# exit N`` at its end); its output is not compared.
- A ```toml block that starts with ``# poolsight-rules.toml`` is a rules file ``poolsight diff
  --rules`` must accept.
- Shell commands run with ``bash`` in the same kind of directory as the Python blocks, with the
  ``poolsight`` installed next to this interpreter first on ``PATH``.

An HTML comment on the line just before a fence tunes a block:

- ``<!-- docs-test: skip (why) -->``: not run here (it installs something, builds the release
  binary, needs a GPU...); the reason is the skip's.
- ``<!-- docs-test: setup=NAME -->``: runs after the setup ``NAME`` below, which stands for what
  the reader has and the example takes as given (a model, a training function, traces named
  ``base.pstrace``...).

```rust blocks are doc tests of the ``poolsight`` crate (``cargo test --doc -p poolsight``): the
end of src/lib.rs includes the pages that have them.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
# docs/queries.md has its own tests (python/tests/test_parquet.py runs every query there).
PAGES = [REPO / "README.md"] + sorted(
    p for p in (REPO / "docs").glob("*.md") if p.name != "queries.md"
)
CHAINER_PYTHON = os.environ.get("POOLSIGHT_CHAINER_PYTHON")
# The `poolsight` command installed with this interpreter's package (as conftest finds it).
BIN = Path(sys.executable).parent

FENCE = re.compile(r"^```(\S*)")
MARKER = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
EXIT = re.compile(r"#\s*exit\s+(\d+)\s*$")

# Setups: what an example takes as given. Python setups run before the block, in the same
# program; shell setups prepare its directory.
PYTHON_SETUPS = {
    # A small MLP on CPU, its optimizer, and one epoch of training on synthetic data.
    "torch_mlp": """
        import torch

        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        _x = torch.randn(128, 16)
        _y = _x[:, :4].argmax(dim=1)


        def train_one_epoch(model, optimizer):
            for xb, yb in zip(_x.split(32), _y.split(32)):
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(xb), yb).backward()
                optimizer.step()
    """,
    # The same MLP as a LightningModule, and its data.
    "lightning_mlp": """
        import lightning
        import torch

        torch.manual_seed(0)


        class MLP(lightning.LightningModule):
            def __init__(self):
                super().__init__()
                self.net = torch.nn.Sequential(
                    torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
                )

            def training_step(self, batch, batch_idx):
                x, y = batch
                return torch.nn.functional.cross_entropy(self.net(x), y)

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)


        model = MLP()
        _x = torch.randn(128, 16)
        train_loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(_x, _x[:, :4].argmax(dim=1)), batch_size=32
        )
    """,
    # fastai DataLoaders of synthetic data on CPU, and the MLP.
    "fastai_dls": """
        import torch
        from fastai.data.core import DataLoaders

        torch.manual_seed(0)
        _x = torch.randn(256, 16)
        _y = _x[:, :4].argmax(dim=1)
        dls = DataLoaders.from_dsets(
            list(zip(_x[:192], _y[:192])), list(zip(_x[192:], _y[192:])), bs=32, device="cpu"
        )
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
        )
    """,
    # A tiny GPT-2 made from its config (nothing downloaded), synthetic token ids, and the
    # Trainer's arguments for two epochs on CPU.
    "hf_gpt2": """
        import torch
        import transformers

        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(
            transformers.GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=2)
        )
        train_dataset = [
            {"input_ids": ids, "labels": ids} for ids in torch.randint(0, 128, (16, 16))
        ]
        args = transformers.TrainingArguments(
            output_dir="out", num_train_epochs=2, per_device_train_batch_size=4, use_cpu=True,
            report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
        )
    """,
    # A Chainer Trainer: an MLP classifier, two epochs of synthetic data.
    "chainer_trainer": """
        import chainer
        import chainer.functions as F
        import chainer.links as L
        import numpy as np
        from chainer import training


        class MLP(chainer.Chain):
            def __init__(self):
                super().__init__()
                with self.init_scope():
                    self.l1 = L.Linear(None, 32)
                    self.l2 = L.Linear(None, 4)

            def forward(self, x):
                return self.l2(F.relu(self.l1(x)))


        _rng = np.random.RandomState(0)
        _x = _rng.rand(96, 8).astype(np.float32)
        _t = _rng.randint(0, 4, size=96).astype(np.int32)
        _model = L.Classifier(MLP())
        _optimizer = chainer.optimizers.SGD()
        _optimizer.setup(_model)
        _it = chainer.iterators.SerialIterator(
            chainer.datasets.TupleDataset(_x, _t), 16, shuffle=False
        )
        trainer = training.Trainer(
            training.StandardUpdater(_it, _optimizer), (2, "epoch"), out="result"
        )
    """,
}


def _traces(tmp: Path) -> None:
    """``run.pstrace`` (Chainer's nested functions), ``base.pstrace`` and ``new.pstrace`` (the
    two ranks of one job: the new one's peak is twice the base's, its time 14 % shorter), and
    ``base-1..3`` / ``new-1..3`` copies of the same run (several runs per side, no change)."""
    traces = FIXTURES / "traces"
    shutil.copy(traces / "chainer_nested.pstrace", tmp / "run.pstrace")
    shutil.copy(traces / "two_ranks-rank0.pstrace", tmp / "base.pstrace")
    shutil.copy(traces / "two_ranks-rank1.pstrace", tmp / "new.pstrace")
    for side in ("base", "new"):
        for i in (1, 2, 3):
            shutil.copy(traces / "chainer_nested.pstrace", tmp / f"{side}-{i}.pstrace")


def _train_script(tmp: Path) -> None:
    """``train.py``: a small model trained for ``--steps`` steps at ``--batch-size``."""
    shutil.copy(FIXTURES / "scripts" / "train_mlp.py", tmp / "train.py")


SHELL_SETUPS = {"traces": _traces, "train_script": _train_script}

# What `import poolsight.X` needs installed.
INTEGRATIONS = {"torch", "cupy", "chainer", "lightning", "fastai", "transformers"}

DURATION = re.compile(r" *(?<![\w.])\d+(?:\.\d+)? ?(?:ns|us|µs|ms|sec|s|min)\b")


def normalise(text: str) -> str:
    """What a console example is compared on: durations (``96.70us``, ``1.23 s``, ``12.90sec``)
    read ``<duration>`` (with the spaces that align them: their width varies), trailing spaces
    and trailing blank lines are dropped (editors strip them from the page)."""
    lines = [DURATION.sub(" <duration>", line).rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    skip: str | None = None
    setup: str | None = None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    found = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        block = Block(page, start + 1, m.group(1), "\n".join(body) + "\n")
        marker = MARKER.match(lines[start - 1]) if start > 0 else None
        if marker:
            spec = marker.group(1)
            skip = re.fullmatch(r"skip\s*\((.+)\)", spec)
            setup = re.fullmatch(r"setup=(\w+)", spec)
            if skip:
                block.skip = skip.group(1)
            elif setup:
                block.setup = setup.group(1)
            else:
                raise ValueError(f"{block.id}: unknown docs-test marker {spec!r}")
        found.append(block)
    return found


ALL = [b for page in PAGES for b in blocks(page)]


def _of(*langs: str) -> list:
    return [pytest.param(b, id=b.id) for b in ALL if b.lang in langs]


def _skip(block: Block, reason: str) -> None:
    print(f"skipped {block.id}: {reason}", file=sys.stderr)
    pytest.skip(f"{block.id}: {reason}")


def _workdir(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURES, tmp_path / "fixtures")
    return tmp_path


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["NO_COLOR"] = "1"
    return env


def _poolsight(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "poolsight"), *map(str, args)],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _needs(code: str) -> set:
    """The packages a program imports (``poolsight.torch`` needs ``torch``)."""
    needed = set()
    for node in ast.walk(ast.parse(code)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "poolsight" and len(parts) > 1 and parts[1] in INTEGRATIONS:
                needed.add(parts[1])
            elif parts[0] != "poolsight":
                needed.add(parts[0])
    return needed


def _check_markers():
    """A docs-test comment anywhere but right before a fence would be silently ignored."""
    for page in PAGES:
        lines = page.read_text().splitlines()
        for n, line in enumerate(lines):
            if MARKER.match(line):
                following = lines[n + 1] if n + 1 < len(lines) else ""
                assert FENCE.match(following), f"{page.name}:{n + 1}: marker not before a fence"


def test_markers_are_before_fences_and_setups_exist():
    _check_markers()
    for b in ALL:
        if b.setup:
            known = PYTHON_SETUPS if b.lang == "python" else SHELL_SETUPS
            assert b.setup in known, f"{b.id}: no {b.lang} setup named {b.setup!r}"
    # The pages do have examples of each kind (a parsing slip would skip them all).
    langs = {b.lang for b in ALL}
    assert {"python", "console", "sh", "rust"} <= langs, langs


@pytest.mark.parametrize("block", _of("python"))
def test_python_example(block: Block, tmp_path):
    if block.skip:
        _skip(block, block.skip)
    setup = textwrap.dedent(PYTHON_SETUPS[block.setup]) if block.setup else ""
    program = setup + "\n" + block.text
    needed = _needs(program)
    if "chainer" in needed:
        if not CHAINER_PYTHON:
            _skip(
                block,
                "Chainer runs in its own environment: POOLSIGHT_CHAINER_PYTHON is unset "
                "(scripts/test.sh makes .venv-chainer and sets it)",
            )
        python = CHAINER_PYTHON
    else:
        missing = sorted(m for m in needed if importlib.util.find_spec(m) is None)
        if missing:
            _skip(block, f"{', '.join(missing)} not installed")
        python = sys.executable
    work = _workdir(tmp_path)
    (work / "example.py").write_text(program)
    before = set(work.rglob("*.pstrace"))
    out = subprocess.run(
        [python, "example.py"],
        cwd=work,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, f"{block.id} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    for trace in sorted(set(work.rglob("*.pstrace")) - before):
        info = _poolsight("info", trace, cwd=work)
        assert info.returncode == 0 and "warning" not in info.stderr, (
            f"{block.id} left {trace.name} unreadable or partial:\n{info.stderr}"
        )


def _commands(lines: list) -> list:
    """Joins ``\\`` continuations."""
    joined, current = [], ""
    for line in lines:
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        joined.append(current + line)
        current = ""
    if current:
        joined.append(current)
    return joined


def _run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _expected_exit(command: str) -> int:
    m = EXIT.search(command)
    return int(m.group(1)) if m else 0


def _prepare(block: Block, tmp_path: Path) -> Path:
    if block.skip:
        _skip(block, block.skip)
    work = _workdir(tmp_path)
    if block.setup:
        SHELL_SETUPS[block.setup](work)
    return work


@pytest.mark.parametrize("block", _of("console"))
def test_console_example(block: Block, tmp_path):
    work = _prepare(block, tmp_path)
    steps = []  # (command, expected output lines)
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        assert lines[i].startswith("$ "), f"{block.id}: output before any command: {lines[i]!r}"
        command = [lines[i][2:]]
        i += 1
        while command[-1].endswith("\\") and i < len(lines):
            command.append(lines[i])
            i += 1
        output = []
        while i < len(lines) and not lines[i].startswith("$ "):
            output.append(lines[i])
            i += 1
        steps.append((_commands(command)[0], output))
    assert steps, f"{block.id}: no command"
    for command, output in steps:
        out = _run(command, work)
        assert out.returncode == _expected_exit(command), (
            f"{block.id}: `{command}` exited {out.returncode}:\n{out.stdout}{out.stderr}"
        )
        actual = out.stdout + out.stderr
        assert normalise(actual) == normalise("\n".join(output)), (
            f"{block.id}: `{command}` printed something else; it prints now:\n{actual}"
        )


@pytest.mark.parametrize("block", _of("sh"))
def test_shell_example(block: Block, tmp_path):
    work = _prepare(block, tmp_path)
    commands = [c for c in _commands(block.text.splitlines()) if c.strip()]
    commands = [c for c in commands if not c.lstrip().startswith("#")]
    assert commands, f"{block.id}: no command"
    for command in commands:
        out = _run(command, work)
        assert out.returncode == _expected_exit(command), (
            f"{block.id}: `{command}` exited {out.returncode}:\n{out.stdout}{out.stderr}"
        )


RULES_FILES = [
    pytest.param(b, id=b.id)
    for b in ALL
    if b.lang == "toml" and b.text.startswith("# poolsight-rules.toml")
]


@pytest.mark.parametrize("block", RULES_FILES)
def test_rules_file_example(block: Block, tmp_path):
    work = _workdir(tmp_path)
    (work / "poolsight-rules.toml").write_text(block.text)
    trace = "fixtures/traces/chainer_nested.pstrace"
    out = _poolsight("diff", trace, trace, "--rules", "poolsight-rules.toml", cwd=work)
    assert out.returncode == 0, f"{block.id}: {out.stdout}{out.stderr}"
    assert "warning" not in out.stderr, out.stderr


ANCHOR_DROP = re.compile(r"[^\w\- ]")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"^```.*?^```", flags=re.M | re.S)  # fenced blocks hold no links


def _anchors(page: Path) -> set:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    text = CODE.sub("", page.read_text())
    return {
        ANCHOR_DROP.sub("", m.group(1).strip().lower()).replace(" ", "-")
        for m in re.finditer(r"^#+\s+(.*)$", text, flags=re.M)
    }


@pytest.mark.parametrize("page", [pytest.param(p, id=p.name) for p in PAGES])
def test_relative_links_resolve(page: Path):
    text = CODE.sub("", page.read_text())
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"
