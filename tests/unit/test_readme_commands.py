"""Every `enginefarm ...` command the README and the usage pages name exists: each answers `--help` with exit 0.
A page that names a command the CLI lacks (once: `enginefarm resolve`) fails here."""

from __future__ import annotations

import re
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from enginefarm.client.cli import app

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", "docs/usage.md", "docs/ci.md", "docs/deploy.md", "docs/features.md"]
# `enginefarm` followed by a word, in a code span or a line of a fenced block (prose says "enginefarm is ...").
COMMAND = re.compile(r"\benginefarm((?: +[a-z][a-z0-9-]*)+)")


def code_of(text: str) -> list[str]:
    """The page's code: each line of its fenced blocks, and each inline code span."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)
    return [line for block in fenced for line in block.splitlines()] + re.findall(r"`([^`\n]+)`", prose)


def named_commands(page: str) -> set[str]:
    return {" ".join(m.group(1).split()) for code in code_of((ROOT / page).read_text()) for m in COMMAND.finditer(code)}


@pytest.fixture(scope="module")
def root():  # typer's own click Group
    for plugin in entry_points(group="enginefarm.commands"):  # the farm's commands, as `enginefarm` loads them
        plugin.load()(app)
    return typer.main.get_command(app)


def command_path(root, words: str) -> list[str]:
    """The command a line names: its words down the groups to a command (the rest are arguments)."""
    path, node = [], root
    for word in words.split():
        if not hasattr(node, "commands"):  # a command: the rest are its arguments
            break
        if word not in node.commands:
            raise AssertionError(
                f"`enginefarm {' '.join([*path, word])}`: no such command "
                f"(there are: {', '.join(sorted(node.commands))})"
            )
        path.append(word)
        node = node.commands[word]
    assert not hasattr(node, "commands"), f"`enginefarm {' '.join(path)}` is a group: name one of its commands"
    return path


def test_the_pages_name_commands():
    assert {"up", "upload", "build", "report", "fetch"} <= {c.split()[0] for c in named_commands("README.md")}
    assert len(set().union(*(named_commands(p) for p in PAGES))) > 20


@pytest.mark.parametrize("page", PAGES)
def test_every_command_a_page_names_answers_help(root, page):
    runner = CliRunner()
    for words in sorted(named_commands(page)):
        path = command_path(root, words)
        out = runner.invoke(app, [*path, "--help"])
        assert out.exit_code == 0, f"{page}: `enginefarm {' '.join(path)} --help` exited {out.exit_code}: {out.output}"


def test_a_command_that_does_not_exist_is_caught(root):
    with pytest.raises(AssertionError, match="enginefarm resolve`: no such command"):
        command_path(root, "resolve resnet50")


def test_the_commands_the_install_table_lists_for_the_client_exist(root):
    """The table's first row names the client's commands as bare words (`fetch`, `ls`, ...)."""
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if "the client only:" in line)
    listed = re.findall(r"`([a-z][a-z-]*)`", row.split("the client only:", 1)[1].split("the Python client", 1)[0])
    assert len(listed) >= 5, row
    assert [c for c in listed if c not in root.commands] == []
