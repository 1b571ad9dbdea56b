"""The reference docs stay reference (issue 73): README.md and every package README at most 300 lines, every module
in its package's map, every flag they name a flag of bertkit (of the very command, where a command line names one),
every relative link to a file that exists."""
import re
from pathlib import Path

import click
import pytest

from bertkit.cli import main

REPO = Path(__file__).resolve().parents[1]
PACKAGES = [REPO / "bertkit", REPO / "pipelines", REPO / "kernels",
            *sorted(p.parent for p in (REPO / "bertkit").glob("*/README.md"))]
DOCS = [REPO / "README.md", REPO / "README.ko.md", *(p / "README.md" for p in PACKAGES)]
FLAG = re.compile(r"(?<![\w#-])--[a-z][a-z0-9-]*[a-z0-9](?![\w])")   # a flag with underscores is another tool's
COMMAND = re.compile(r"(?:\bbertkit|\bcli\.py)\s+([a-z][a-z-]+)(?:\s+([a-z][a-z-]+))?((?:[^\n`|]|\\\n)*)")


def options(command) -> set[str]:
    return {o for p in command.params for o in p.opts + p.secondary_opts}


def every_command(group, found=None) -> dict:
    found = {} if found is None else found
    for name, command in group.commands.items():
        found[name] = command
        if isinstance(command, click.Group):
            for sub, subcommand in command.commands.items():
                found[f"{name} {sub}"] = subcommand
    return found


COMMANDS = every_command(main)
LAUNCHER = {"--module", "--hostfile", "--include", "--exclude", "--help"}   # deepspeed's own (and --num_gpus ...)
BENCHMARKS = {f for p in (REPO / "benchmarks").glob("*/*.py")                 # a study's script, named in prose
              for f in re.findall(r"add_argument\(\s*\"(--[a-z][a-z0-9-]*)\"", p.read_text(encoding="utf-8"))}
ALL_FLAGS = set().union(*(options(c) for c in COMMANDS.values()), options(main), LAUNCHER, BENCHMARKS)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_a_reference_doc_is_at_most_300_lines(doc):
    assert len(doc.read_text(encoding="utf-8").splitlines()) <= 300, f"{doc}: move studies to docs/studies/"


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_module_is_in_its_packages_map(package):
    """A module of a folder without a README of its own belongs in its parent's map."""
    text = (package / "README.md").read_text(encoding="utf-8")
    modules = [p for p in package.glob("*.py") if p.name != "__init__.py"]
    modules += [p for sub in package.iterdir() if sub.is_dir() and not (sub / "README.md").exists()
                and sub.name != "__pycache__" for p in sub.glob("*.py") if p.name != "__init__.py"]
    missing = sorted(str(p.relative_to(REPO)) for p in modules if f"`{p.name}`" not in text)
    assert not missing, f"{package / 'README.md'} does not name {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_flag_named_is_a_flag_of_bertkit(doc):
    text = doc.read_text(encoding="utf-8")
    wrong = []
    for m in COMMAND.finditer(text):
        name = f"{m.group(1)} {m.group(2)}" if f"{m.group(1)} {m.group(2)}" in COMMANDS else m.group(1)
        if name in COMMANDS:
            rest = m.group(3) if name == m.group(1) and m.group(2) is None else m.group(0)
            wrong += [f"{name} {f}" for f in FLAG.findall(rest) if f not in options(COMMANDS[name]) | LAUNCHER]
    prose = "\n".join(line for line in text.splitlines() if "benchmarks/" not in line or "python" not in line)
    wrong += [f for f in FLAG.findall(prose) if f not in ALL_FLAGS]
    assert not wrong, f"{doc} names flags bertkit does not have: {sorted(set(wrong))}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_is_a_file_that_exists(doc):
    text = doc.read_text(encoding="utf-8")
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text)
               if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    missing = sorted({t for t in targets if t and not (doc.parent / t).exists()})
    assert not missing, f"{doc} links to {missing}, which do not exist"
