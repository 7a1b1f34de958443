"""Every command of the ``ratune`` tree is named in the CLI module's summary and in docs/pipeline.md
(the command table), so neither drifts from the parser when a command is added."""
import argparse
from pathlib import Path

import ratune.cli as cli

ROOT = Path(__file__).resolve().parents[1]


def command_names(parser: argparse.ArgumentParser, prefix: str = "ratune") -> list[str]:
    """The leaf commands under ``parser`` as ``ratune a b`` strings (a parser without sub-commands is a leaf)."""
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not actions:
        return [prefix]
    names = []
    for name, sub in actions[0].choices.items():
        names += command_names(sub, f"{prefix} {name}")
    return names


def test_the_tree_has_the_commands_this_test_expects():
    names = command_names(cli.build_parser())
    assert {"ratune data build", "ratune data utility", "ratune retrieval train", "ratune eval run",
            "ratune catalog pairs", "ratune demo"} <= set(names)


def test_every_command_is_in_the_cli_summary_and_the_pipeline_table():
    names = command_names(cli.build_parser())
    pipeline = (ROOT / "docs" / "pipeline.md").read_text()
    missing_summary = [n for n in names if n not in cli.__doc__]
    missing_pipeline = [n for n in names if f"`{n}" not in pipeline]
    assert missing_summary == []
    assert missing_pipeline == []
