"""A tool set (``ratune tools import``, sources/toolset.py) as a kind of hub: its documents are the
tools (JSON schemas), its examples the function-calling rows, written in the ``python_calls``
answer format."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ratune.errors import RatuneError
from ratune.hubs.base import FolderHub, register_hub_kind
from ratune.registry import EXPERIMENT_SETTINGS
from ratune.sources.apibench import Answer, Example, ParseReport
from ratune.sources.formats import PythonCallsFormat, ToolCallsFormat
from ratune.sources.toolset import (SPLIT_FILES, TOOL_SET_KIND, TOOLS_FILE, is_tool_set, load_rows, load_tools,
                                    read_tool_set_manifest)

#: :attr:`~ratune.sources.apibench.Example.layout` of a tool set's example.
TOOL_SET_LAYOUT = "tool_set"


@register_hub_kind
@dataclass(frozen=True)
class ToolSetHub(FolderHub):
    """A tool-set folder, named by its path. Each example's ``tools`` are the tools its row offers
    (what ``oracle`` shows), ``calls`` its answer, ``api`` the first tool it calls (the first it
    offers when it calls none) and ``answer.api_call`` the answer as text."""

    kind: ClassVar[str] = TOOL_SET_KIND
    scorer: ClassVar[str] = TOOL_SET_KIND
    choices_text: ClassVar[str] = "a tool-set folder (ratune tools import)"
    answer_format: ClassVar[str] = PythonCallsFormat.name
    other_answer_formats: ClassVar[tuple[str, ...]] = (ToolCallsFormat.name,)
    card_tags: ClassVar[tuple[str, ...]] = ("function-calling",)

    @classmethod
    def claims(cls, text: str) -> bool:
        return bool(text) and is_tool_set(text)

    @classmethod
    def from_ref(cls, text: str, apibench_dir=None) -> "ToolSetHub":
        return cls(name=read_tool_set_manifest(text)["name"], folder=Path(text))

    @property
    def api_database_file(self) -> Path:
        return self.folder / TOOLS_FILE

    def examples_file(self, split: str) -> Path:
        if split not in SPLIT_FILES:
            raise RatuneError(f"unknown split {split!r}: expected one of {', '.join(SPLIT_FILES)}")
        return self.folder / SPLIT_FILES[split]

    def load_api_database(self) -> list[dict]:
        return list(load_tools(self.folder).values())

    def load_examples(self, split: str, *, lenient: bool = False, report: ParseReport | None = None) -> list[Example]:
        """The split's rows (``lenient`` is not used: the rows were checked when imported)."""
        path = self.examples_file(split)
        if not path.is_file():
            raise RatuneError(f"{path}: tool set {self.name} has no {split} rows (an import with --eval-fraction 0 "
                              "has no eval rows); rerun `ratune tools import`")
        examples = []
        for line, row in load_rows(self.folder, split, load_tools(self.folder)):
            by_name = {t["name"]: t for t in row["tools"]}
            called = [by_name[c["name"]] for c in row["calls"] if c["name"] in by_name]
            api = (called or row["tools"] or [{"name": "", "description": "", "parameters": {}}])[0]
            answer = Answer(domain="", api_call=PythonCallsFormat.render_calls(row["calls"]), api_provider="",
                            explanation="", code="")
            examples.append(Example(hub=self.name, split=split, line=line, instruction=row["query"], api=api,
                                    answer=answer, layout=TOOL_SET_LAYOUT, tools=tuple(row["tools"]),
                                    calls=tuple(row["calls"]), system=row.get("system")))
        return examples

    def setting_refusal(self, setting: str) -> str | None:
        """The experiments (swap, irrelevant, constraints_*) are refused: their scoring reads API
        documents' domains and APIBench answers."""
        if setting in EXPERIMENT_SETTINGS:
            return (f"test setting {setting}: an experiment of the API hubs, not run on tool set {self.name}; its "
                    f"settings are {', '.join(self.default_settings)}")
        return super().setting_refusal(setting)

    def manifest_record(self) -> dict:
        """``kind``, ``path``, ``name``, the import's ``source`` and ``split``."""
        manifest = read_tool_set_manifest(self.folder)
        return {"kind": TOOL_SET_KIND, "path": str(self.folder.resolve()), "name": self.name,
                "source": manifest.get("source"), "split": manifest.get("split")}

    @classmethod
    def card_trained_on(cls, name, record):
        return f"on the tool set `{name}` (function calling, imported with `ratune tools import`)"

    @classmethod
    def card_files_label(cls, name, record):
        return f"Tool set `{name}` files"
