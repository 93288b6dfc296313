"""Every command and option of `enginefarm` says what it is for, and `--version` answers."""

from __future__ import annotations

import subprocess
import sys

import typer.main

from enginefarm import __version__
from enginefarm.client.cli import app


def commands(group, prefix: str = ""):
    for name, command in group.commands.items():
        yield f"{prefix}{name}", command
        if hasattr(command, "commands"):  # a group (typer carries its own click)
            yield from commands(command, f"{prefix}{name} ")


def test_every_command_and_option_has_help():
    from importlib.metadata import entry_points

    for plugin in entry_points(group="enginefarm.commands"):  # the farm's commands, as `enginefarm` loads them
        plugin.load()(app)
    root = typer.main.get_command(app)
    found = dict(commands(root))
    assert {"fetch", "build", "ci", "ls builds", "up", "demo", "token create", "worker"} <= set(found)
    missing = [
        f"{name} {p.opts[0]}"
        for name, command in found.items()
        for p in command.params
        if p.param_type_name == "option" and not p.help and p.name not in ("help",)
    ]
    undocumented = [name for name, command in found.items() if not (command.help or command.short_help)]
    assert not missing and not undocumented, (missing, undocumented)


def test_version():
    out = subprocess.run([sys.executable, "-m", "enginefarm", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"enginefarm {__version__}"


def test_the_token_given_after_the_command_is_moved_before_it():
    from enginefarm.client.cli import hoisted

    assert hoisted(["ls", "models", "--token", "T", "--api", "u"]) == ["--token", "T", "ls", "models", "--api", "u"]
    assert hoisted(["fetch", "m", "--token=T"]) == ["--token=T", "fetch", "m"]
    # after "--" nothing is an option; a --token without its value is left for the parser to refuse
    assert hoisted(["ci", "m", "--", "--token", "T"]) == ["ci", "m", "--", "--token", "T"]
    assert hoisted(["ls", "--token"]) == ["ls", "--token"]
    # given before and after: the one after is the later, and wins, as it would in place
    assert hoisted(["--token", "A", "--api", "u", "ls", "--token", "B"]) == [
        "--token", "A", "--api", "u", "--token", "B", "ls",
    ]  # fmt: skip
