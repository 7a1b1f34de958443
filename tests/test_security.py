"""Security: no eval/exec/pickle of anything read; trust_remote_code only when a
config sets it; hub tokens never written.

- A source audit parses every ratune source file with ``ast`` (comments, strings and docstrings
  cannot fool it) and refuses eval/exec, pickle-family modules, ``torch.load`` without
  ``weights_only=True``, ``yaml.load`` without a safe loader, ``allow_pickle=True`` and a literal
  ``trust_remote_code=True``. The checker itself is tested on small sources.
- A checkpoint whose config.json / tokenizer_config.json carry an ``auto_map`` to a custom code file
  (which writes a marker file when imported) is loaded by every ratune loader without running that
  code; the same loader with trust_remote_code on does run it (so the marker really detects
  execution). A config's ``trust_remote_code: true`` reaches ``from_pretrained`` in training and
  export.
- A small whole run (data build, train 1 step, eval 2 questions, report, export) made with a fake
  hub token in the environment writes the token into no file and prints it nowhere.
"""

from __future__ import annotations

import ast
import json
import shutil
import sys
from pathlib import Path

import pytest
from source_tree import PACKAGE_DIRS

REPO = Path(__file__).resolve().parent.parent
#: ratune's source folders (the sub-packages of the ``ratune`` import name, plus bench scripts).
SOURCE_DIRS = (*PACKAGE_DIRS, "bench")

# --------------------------------------------------------------------------------------------
# (a) source audit

#: Modules that deserialize arbitrary objects (code execution on load): never imported.
UNSAFE_MODULES = {"pickle", "_pickle", "cPickle", "marshal", "shelve", "dill", "cloudpickle", "joblib"}
#: yaml loaders that build only plain data.
SAFE_YAML_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"}
_UNSAFE_YAML = {"yaml.unsafe_load", "yaml.unsafe_load_all", "yaml.full_load", "yaml.full_load_all"}
_EXEC_BUILTINS = {"eval", "exec", "builtins.eval", "builtins.exec"}


def _root(name: str | None) -> str:
    return (name or "").split(".")[0]


def audit_source(source: str, filename: str = "<string>") -> list[str]:
    """``["FILE:LINE: what"]`` for every unsafe construct in a Python source (parsed with ast).

    Import aliases are followed (``import torch as th; th.load(f)`` is ``torch.load``; ``from yaml
    import load``). Method calls such as ``model.eval()`` and text in comments, strings or
    docstrings are not calls of the builtins and are not reported.
    """
    tree = ast.parse(source, filename)
    aliases: dict[str, str] = {}
    found: list[tuple[int, str]] = []

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                if _root(a.name) in UNSAFE_MODULES:
                    found.append((node.lineno, f"imports {a.name}"))
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            if _root(node.module) in UNSAFE_MODULES:
                found.append((node.lineno, f"imports from {node.module}"))

    def dotted(expr: ast.expr) -> str | None:
        parts = []
        while isinstance(expr, ast.Attribute):
            parts.append(expr.attr)
            expr = expr.value
        if not isinstance(expr, ast.Name):
            return None
        parts.append(aliases.get(expr.id, expr.id))
        return ".".join(reversed(parts))

    def keyword(call: ast.Call, name: str) -> ast.expr | None:
        return next((k.value for k in call.keywords if k.arg == name), None)

    def is_true(expr: ast.expr | None) -> bool:
        return isinstance(expr, ast.Constant) and expr.value is True

    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == "trust_remote_code" and is_true(v):
                    found.append((node.lineno, "trust_remote_code=True literal (must come from a config)"))
        if not isinstance(node, ast.Call):
            continue
        name = dotted(node.func)
        if name in _EXEC_BUILTINS:
            found.append((node.lineno, f"calls {name}()"))
        elif name in ("__import__", "importlib.import_module") and node.args and isinstance(
                node.args[0], ast.Constant) and _root(str(node.args[0].value)) in UNSAFE_MODULES:
            found.append((node.lineno, f"imports {node.args[0].value} dynamically"))
        elif _root(name) in UNSAFE_MODULES:
            found.append((node.lineno, f"calls {name}()"))
        elif name == "torch.load" and not is_true(keyword(node, "weights_only")):
            found.append((node.lineno, "torch.load() without weights_only=True"))
        elif name in ("yaml.load", "yaml.load_all"):
            loader = keyword(node, "Loader") or (node.args[1] if len(node.args) > 1 else None)
            loader_name = dotted(loader) if loader is not None else None
            if not loader_name or loader_name.split(".")[-1] not in SAFE_YAML_LOADERS:
                found.append((node.lineno, f"{name}() without a safe Loader (use yaml.safe_load)"))
        elif name in _UNSAFE_YAML:
            found.append((node.lineno, f"calls {name}()"))
        elif name and name.split(".")[-1] == "read_pickle":
            found.append((node.lineno, f"calls {name}()"))
        if is_true(keyword(node, "trust_remote_code")):
            found.append((node.lineno, "trust_remote_code=True literal (must come from a config)"))
        if is_true(keyword(node, "allow_pickle")):
            found.append((node.lineno, "allow_pickle=True"))
    return [f"{filename}:{line}: {what}" for line, what in sorted(found)]


def source_files() -> list[Path]:
    files = [p for d in SOURCE_DIRS for p in sorted((REPO / d).rglob("*.py"))]
    return [p for p in files if "__pycache__" not in p.parts]


_BAD = '''\
import pickle
import torch as th
import yaml
from yaml import load as yload
import numpy as np
x = eval(text)
exec(code)
th.load("model.pt")
torch_state = th.load("model.pt", weights_only=False)
yaml.load(text)
yload(text, Loader=yaml.Loader)
yaml.unsafe_load(text)
AutoModel.from_pretrained(path, trust_remote_code=True)
np.load("x.npy", allow_pickle=True)
from marshal import loads
kwargs = {"trust_remote_code": True}
__import__("dill")
'''

_GOOD = '''\
"""A docstring that says eval(x), exec(y), pickle.loads(z) and torch.load(f) without running them."""
import ast
import torch
import yaml
# eval(text); exec(code); import pickle; torch.load(f); trust_remote_code=True
note = "pickle.loads(data) and yaml.load(text) and trust_remote_code=True inside a string"
model.eval()
self.eval()
value = ast.literal_eval(text)
state = torch.load(path, weights_only=True)
cfg = yaml.safe_load(text)
cfg2 = yaml.load(text, Loader=yaml.SafeLoader)
model = AutoModel.from_pretrained(path, trust_remote_code=config.trust_remote_code)
tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
'''


def test_audit_checker_finds_each_unsafe_call_and_ignores_text():
    found = audit_source(_BAD, "bad.py")
    assert found == [
        "bad.py:1: imports pickle",
        "bad.py:6: calls eval()",
        "bad.py:7: calls exec()",
        "bad.py:8: torch.load() without weights_only=True",
        "bad.py:9: torch.load() without weights_only=True",
        "bad.py:10: yaml.load() without a safe Loader (use yaml.safe_load)",
        "bad.py:11: yaml.load() without a safe Loader (use yaml.safe_load)",
        "bad.py:12: calls yaml.unsafe_load()",
        "bad.py:13: trust_remote_code=True literal (must come from a config)",
        "bad.py:14: allow_pickle=True",
        "bad.py:15: imports from marshal",
        "bad.py:16: trust_remote_code=True literal (must come from a config)",
        "bad.py:17: imports dill dynamically",
    ]
    assert audit_source(_GOOD, "good.py") == []


def test_audit_of_ratune_sources(tmp_path):
    files = source_files()
    names = {str(p.relative_to(REPO)) for p in files}
    # the audit really covers the stages (a wrong SOURCE_DIRS would pass vacuously)
    assert {"ratune/cli.py", "sources/apibench.py", "retrieval/retrievers.py", "ratune/models.py", "train/sft.py",
            "export/checkpoint.py", "eval/run.py", "eval/scoring/scorer.py"} <= names
    problems = [p for f in files for p in audit_source(f.read_text(encoding="utf-8"), str(f.relative_to(REPO)))]
    assert problems == [], "\n".join(problems)

    # adding one unsafe call to a real source file is caught, with its file and line
    src = (REPO / "eval" / "run.py").read_text(encoding="utf-8")
    lines = src.count("\n")
    planted = src + "\n\ndef _load_responses(path):\n    import pickle\n    return pickle.load(open(path, 'rb'))\n"
    assert audit_source(planted, "eval/run.py") == [f"eval/run.py:{lines + 4}: imports pickle",
                                                    f"eval/run.py:{lines + 5}: calls pickle.load()"]


# --------------------------------------------------------------------------------------------
# (b) trust_remote_code only when a config sets it


def _custom_code_checkpoint(src: Path, folder: Path, marker: Path, *, model_type: str | None = None,
                            model: bool = True) -> Path:
    """A copy of the tiny model whose tokenizer config and (``model``) config point (auto_map) at a
    custom code file that writes ``marker`` when imported."""
    shutil.copytree(src, folder)
    (folder / "custom_code.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('custom code ran')\n", encoding="utf-8")
    cfg = json.loads((folder / "config.json").read_text())
    if model:
        cfg["auto_map"] = {"AutoConfig": "custom_code.CustomConfig", "AutoModelForCausalLM": "custom_code.CustomModel"}
    if model_type:
        cfg["model_type"] = model_type
    (folder / "config.json").write_text(json.dumps(cfg))
    tok = json.loads((folder / "tokenizer_config.json").read_text())
    tok["auto_map"] = {"AutoTokenizer": ["custom_code.CustomTokenizer", None]}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    return folder


@pytest.fixture
def modules_cache(tmp_path, monkeypatch):
    """transformers copies custom code into HF_MODULES_CACHE before importing it: keep it in tmp."""
    import transformers.dynamic_module_utils as dmu

    monkeypatch.setattr(dmu, "HF_MODULES_CACHE", str(tmp_path / "hf_modules"))
    monkeypatch.setattr(sys, "path", list(sys.path))  # init_hf_modules appends the cache folder
    return tmp_path / "hf_modules"


def test_custom_code_in_a_checkpoint_is_not_run(tmp_path, tiny_model_dir, apibench, modules_cache):
    from transformers import LlamaForCausalLM

    from ratune.eval.run import EvalSettings, evaluate_checkpoint
    from ratune.export.checkpoint import export_checkpoint
    from ratune.models import load_model, load_tokenizer

    marker = tmp_path / "MARKER"
    folder = _custom_code_checkpoint(tiny_model_dir, tmp_path / "llama_with_auto_map", marker)
    # a known architecture with an auto_map: the library's own class is used, the file never imported
    assert load_tokenizer(folder).eos_token_id is not None
    assert type(load_model(folder)) is LlamaForCausalLM
    results = evaluate_checkpoint(folder, hub="torchhub", apibench_dir=apibench, out_dir=tmp_path / "eval",
                                  progress=False, settings=EvalSettings(settings=["0_shot"], n_questions=1,
                                                                        batch_size=1, max_new_tokens=2))
    assert results["0_shot"]["n"] == 1
    export_checkpoint(folder, tmp_path / "exported")
    assert (tmp_path / "exported" / "model.safetensors").exists()
    assert not marker.exists()

    # an architecture only the custom code defines: refused, not run
    other = _custom_code_checkpoint(tiny_model_dir, tmp_path / "custom_only", marker, model_type="ratune-custom")
    with pytest.raises(ValueError, match="contains custom code"):
        load_model(other)
    with pytest.raises(ValueError, match="contains custom code"):
        evaluate_checkpoint(other, hub="torchhub", apibench_dir=apibench, out_dir=tmp_path / "eval_other",
                            progress=False, settings=EvalSettings(settings=["0_shot"], n_questions=1,
                                                                  batch_size=1, max_new_tokens=2))
    assert not marker.exists()
    assert not modules_cache.exists() or not list(modules_cache.rglob("custom_code.py"))

    # control: with trust_remote_code on, the same loaders do import the file (the marker works)
    with pytest.raises(AttributeError, match="CustomModel|CustomConfig"):
        load_model(other, trust_remote_code=True)
    assert marker.read_text() == "custom code ran"
    marker_tok = tmp_path / "MARKER_TOKENIZER"
    tok_folder = _custom_code_checkpoint(tiny_model_dir, tmp_path / "tok_custom", marker_tok, model=False)
    with pytest.raises(AttributeError, match="CustomTokenizer"):
        load_tokenizer(tok_folder, trust_remote_code=True)
    assert marker_tok.exists()


class _Stop(Exception):
    """Raised by the recording from_pretrained to end a stage once the model load is seen."""


@pytest.fixture
def recorded_loads(monkeypatch):
    """Record the kwargs of AutoTokenizer / AutoModelForCausalLM.from_pretrained; the tokenizer is
    loaded for real, the model load stops the stage (raises _Stop)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    calls = []
    real_tokenizer = AutoTokenizer.from_pretrained

    def tokenizer_from_pretrained(path, *args, **kwargs):
        calls.append(("tokenizer", kwargs.get("trust_remote_code")))
        return real_tokenizer(path, *args, **kwargs)

    def model_from_pretrained(path, *args, **kwargs):
        calls.append(("model", kwargs.get("trust_remote_code")))
        raise _Stop

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", staticmethod(tokenizer_from_pretrained))
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", staticmethod(model_from_pretrained))
    return calls


@pytest.mark.parametrize("trust", [False, True])
def test_config_trust_remote_code_reaches_the_loaders(trust, tmp_path, tiny_model_dir, recorded_loads, monkeypatch):
    import ratune.train.preflight as preflight
    import ratune.train.sft as sft
    from ratune.io import write_json
    from ratune.train.config import TrainConfig
    from ratune.export.checkpoint import export_checkpoint

    # training: the config's value (default False) goes to tokenizer and model loading
    monkeypatch.setattr(preflight, "check_training_data", lambda config: None)  # no data: rows are replaced below
    monkeypatch.setattr(preflight, "load_training_rows",
                        lambda config, tokenizer: ({"input_ids": [[1, 2]], "labels": [[-100, 2]]}, {"examples": 1}))
    extra = {"trust_remote_code": True} if trust else {}
    cfg = TrainConfig(model=str(tiny_model_dir), data_dir=str(tmp_path / "data"), train_retriever="none",
                      output_dir=str(tmp_path / "run"), global_batch_size=1, max_steps=1, **extra)
    with pytest.raises(_Stop):
        sft.train(cfg)
    assert recorded_loads == [("tokenizer", trust), ("model", trust)]

    # export: the value recorded in the run's manifest (its training config) is used
    recorded_loads.clear()
    run = tmp_path / "finished_run"
    shutil.copytree(tiny_model_dir, run / "model")
    write_json(run / "manifest.json", {"config": cfg.model_dump(), "model_path": str(tiny_model_dir)})
    (run / ".complete").write_text("complete\n")
    with pytest.raises(_Stop):
        export_checkpoint(run, tmp_path / "exported")
    assert recorded_loads == [("model", trust)]


# --------------------------------------------------------------------------------------------
# (c) hub tokens are never written

FAKE_TOKEN = "hf_FAKEtoken1234567890abcdef"


def test_fake_hub_token_is_written_nowhere(tmp_path, monkeypatch, capfd, apibench, tiny_model_dir,
                                           smol_tokenizer_dir):
    import huggingface_hub
    import yaml

    from ratune.cli import main

    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.setenv(var, FAKE_TOKEN)
    assert huggingface_hub.get_token() == FAKE_TOKEN  # the run really sees a token

    data, run, ev, report, exported = (tmp_path / n for n in ("data", "run", "eval", "report", "exported"))
    common = ["--apibench", str(apibench), "--hub", "torchhub"]
    assert main(["data", "build", *common, "--out", str(data), "--tokenizer", str(smol_tokenizer_dir),
                 "--modes", "none", "--max-length", "512", "--max-document-tokens", "64", "--json"]) == 0
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({
        "model": str(tiny_model_dir), "data_dir": str(data), "train_retriever": "none", "output_dir": str(run),
        "max_length": 512, "global_batch_size": 2, "per_device_batch_size": 2, "max_steps": 1, "max_examples": 2,
        "torch_threads": 1, "lora": {"enabled": True, "r": 2, "alpha": 4, "target_modules": ["q_proj"]}}))
    assert main(["train", "--config", str(config)]) == 0
    assert main(["eval", "run", "--checkpoint", str(run), *common, "--out", str(ev), "--settings", "0_shot",
                 "oracle", "--n-questions", "2", "--batch-size", "2", "--max-new-tokens", "8",
                 "--threads", "1"]) == 0
    assert main(["report", "--eval", f"none={ev}", "--hub", "torchhub", "--model", "tiny", "--out",
                 str(report)]) == 0
    assert main(["export", str(run), "--out", str(exported), "--table2", str(report / "table2.json")]) == 0
    printed = capfd.readouterr()

    written = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    # every stage wrote its artifacts (the grep below is not over an empty folder)
    for must in (data / "manifest.json", run / "manifest.json", run / "log_history.json",
                 run / "model" / "model.safetensors", ev / "oracle" / "metrics.json", ev / "0_shot" / "responses.jsonl",
                 report / "table2.json", report / "table2.png", exported / "README.md",
                 exported / "ratune_export.json", exported / "model.safetensors"):
        assert must in written, must
    secret = FAKE_TOKEN.encode()
    leaks = [str(p.relative_to(tmp_path)) for p, content in written.items()
             if secret in content or secret[3:] in content]
    assert leaks == []
    assert FAKE_TOKEN[3:] not in printed.out and FAKE_TOKEN[3:] not in printed.err
