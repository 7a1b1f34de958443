"""BFCL's own decoder and checker over a batch of answer texts; run by BFCL's Python only
(docs/function_calling.md#the-bridge).

``.bfcl-venv/bin/python -I bfcl_worker.py MODE MODEL IN OUT``; OUT holds ``{"bfcl_version", "model", ...}`` and:

- ``score``: IN ``[{"category", "id", "text"}]``; OUT ``"results": [{"id", "category", "correct", "decoded",
  "calls", "error", "error_type"}]`` in input order (``bfcl evaluate``'s per-entry functions).
- ``prompts``: IN ``[category, ...]``; OUT ``"messages": {category: [[id, messages], ...]}``, as
  ``bfcl generate`` prepares them in prompting mode.

Errors: one line on stderr, exit 2.
"""

import copy
import importlib.metadata
import json
import sys

from bfcl_eval.constants.enums import Language, ReturnFormat
from bfcl_eval.eval_checker.eval_runner import (
    _evaluate_single_ast_entry,
    _evaluate_single_relevance_entry,
    get_handler,
)
from bfcl_eval.utils import (
    is_agentic,
    is_format_sensitivity,
    is_function_calling_format_output,
    is_java,
    is_js,
    is_memory,
    is_multi_turn,
    is_relevance_or_irrelevance,
    is_web_search,
    load_dataset_entry,
    load_ground_truth_entry,
)


def _require_single_turn_python(category):
    if any(f(category) for f in (is_java, is_js, is_multi_turn, is_agentic, is_format_sensitivity,
                                 is_memory, is_web_search)):
        raise ValueError(f"category {category!r} is not a Python single-turn category")


def _category(category, cache):
    """``{id: (prompt entry, possible answer or None)}`` as ``bfcl evaluate`` loads them."""
    if category not in cache:
        _require_single_turn_python(category)
        prompts = load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False)
        if is_relevance_or_irrelevance(category):
            answers = [None] * len(prompts)
        else:
            answers = [a["ground_truth"] for a in load_ground_truth_entry(category)]
        cache[category] = {p["id"]: (p, a) for p, a in zip(prompts, answers)}  # aligned by index, as BFCL does
    return cache[category]


def score(model, items):
    handler, model_dir, cache, results = get_handler(model), model.replace("/", "_"), {}, []
    for item in items:
        category, entry_id, text = item["category"], item["id"], item["text"]
        entries = _category(category, cache)
        if entry_id not in entries:
            raise ValueError(f"no entry {entry_id!r} in BFCL's {category} data")
        prompt, answer = (copy.deepcopy(x) for x in entries[entry_id])
        if is_relevance_or_irrelevance(category):
            verdict = _evaluate_single_relevance_entry(handler, entry_id, text, prompt, model_dir, category)
        else:
            verdict = _evaluate_single_ast_entry(handler, entry_id, text, answer, prompt, model_dir, category,
                                                 language=Language.PYTHON, return_format=ReturnFormat.PYTHON,
                                                 has_tool_call_tag=False)
        try:
            decoded = handler.decode_ast(text, ReturnFormat.PYTHON, False)
            ok = is_function_calling_format_output(decoded)
        except Exception:
            ok = False
        results.append({"id": entry_id, "category": category, "correct": bool(verdict["valid"]), "decoded": ok,
                        "calls": len(decoded) if ok else 0, "error": verdict.get("error"),
                        "error_type": verdict.get("error_type")})
    return results


def prompt_messages(model, categories):
    """``{category: [[id, messages], ...]}``: what MODEL's handler sends for each entry in prompting mode."""
    handler, out = get_handler(model), {}
    for category in categories:
        _require_single_turn_python(category)
        rows = []
        for entry in load_dataset_entry(category):  # as bfcl generate loads it (language hints added)
            entry = copy.deepcopy(entry)
            data = handler._pre_query_processing_prompting(entry)
            data = handler.add_first_turn_message_prompting(data, entry["question"][0])
            rows.append([entry["id"], data["message"]])
        out[category] = rows
    return out


def main(argv):
    mode, model, source, target = argv
    with open(source, encoding="utf-8") as fh:
        request = json.load(fh)
    if mode == "score":
        body = {"results": score(model, request)}
    elif mode == "prompts":
        body = {"messages": prompt_messages(model, request)}
    else:
        raise ValueError(f"unknown mode {mode!r}: expected score or prompts")
    with open(target, "w", encoding="utf-8") as fh:
        json.dump({"bfcl_version": importlib.metadata.version("bfcl-eval"), "model": model, **body},
                  fh, ensure_ascii=False, default=str)  # as BFCL writes score files: str() what JSON lacks


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except Exception as exc:  # one line for the caller (eval/bfcl.py), not a traceback
        print(f"bfcl_worker: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(2)
