"""The eval stage: generate answers for eval questions under each test-time retrieval setting,
store them in the shape of the paper's released response files, and score them.

Output folder (one per checkpoint)::

    {setting}/responses.jsonl   {"question_id", "text", "model", "setting"} per line, appended and
                                flushed per batch; a rerun continues after the last complete line
    {setting}/metrics.json      n, accuracy / hallucination / error (gorilla metric, fractions,
                                each with a 95 % Wilson interval ``*_ci``), the strict metric, parser and package versions, settings
    {setting}/identity.json     checkpoint, questions and generation settings (device and dtype
                                included); a rerun with different ones is refused instead of
                                mixing answers
    {setting}/.complete         written last

Placement: on a machine where torch sees a CUDA GPU the model generates there in bfloat16, else
on the CPU in float32 (``--device``, ``--dtype`` override; :func:`resolve_placement`).

The user turn is rendered by :func:`ratune.data.prompt.render_user_turn`, the function the
training-set builder uses, with the document budget and the chat template the checkpoint was
trained with (its run manifest; :func:`trained_chat_template`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ratune.errors import RatuneError

#: Test-time settings, in Table 2 column order (Gorilla, Table 2; ``dense`` is ours).
SETTINGS = ("0_shot", "bm25", "dense", "gpt_index", "oracle")
#: Test settings with a trained retriever, columns like Table 2's but never run by default:
#: ``dense_ft`` (our finetuned bi-encoder, :mod:`ratune.retrieval.finetune`; needs
#: ``EvalSettings.dense_model``).
TRAINED_SETTINGS = ("dense_ft",)
#: Every retrieval setting, in column order.
TABLE_SETTINGS = SETTINGS + TRAINED_SETTINGS
#: Experiment settings (issue 9), never Table 2 columns: ``swap`` (another API's document of the
#: same domain, :mod:`ratune.eval.swap`), ``irrelevant`` (a document of another domain,
#: :mod:`ratune.eval.abstain`) and ``constraints_{setting}`` (the constrained TorchHub questions
#: under a Table 2 setting, :mod:`ratune.eval.constraints`).
EXPERIMENT_SETTINGS = ("swap", "irrelevant", *(f"constraints_{s}" for s in TABLE_SETTINGS))
#: Generation backends: batched HF generate (default) and vLLM (optional extra, CUDA only).
BACKENDS = ("hf", "vllm")
#: Where the model generates: ``auto`` is ``cuda`` when torch sees a CUDA GPU, else ``cpu``.
DEVICES = ("auto", "cpu", "cuda")
#: The weights' dtype while generating: ``auto`` is ``bfloat16`` on CUDA and ``float32`` on CPU.
DTYPES = ("auto", "float32", "bfloat16", "float16")
#: What cells made before devices and dtypes were recorded ran with (every one of them loaded the
#: model in float32 and never moved it off the CPU; vLLM ran on CUDA in its float32 default).
_LEGACY_PLACEMENT = {"hf": {"device": "cpu", "dtype": "float32"}, "vllm": {"device": "cuda", "dtype": "float32"}}


@dataclass
class EvalSettings:
    """How a checkpoint is evaluated.

    Attributes:
        settings: test-time settings to run (subset of SETTINGS).
        n_questions: evaluate the first N eval questions (None = all); the same in every cell.
        batch_size: prompts per generate call.
        max_new_tokens: generation limit.
        stop_after_api_call: stop once the api_call/api_provider fields are complete.
        max_document_tokens: document budget (None = read from the checkpoint's manifest).
        torch_threads: intra-op threads.
        backend: ``hf`` (batched HF ``generate``, :mod:`ratune.eval.generate`; CPU or GPU) or
            ``vllm`` (:mod:`ratune.eval.vllm_backend`; optional extra, CUDA only; same prompt ids,
            greedy decoding, limit and answer cut). Recorded in each cell's identity when not
            ``hf``, so a cell is never continued with the other backend.
        trust_remote_code: let the checkpoint's own modeling code run (only for a model trained
            with ``trust_remote_code: true``; ``ratune sweep`` passes it for such cells).
        dense_model: the finetuned retriever folder of the ``dense_ft`` settings (``ratune
            retrieval train``); recorded in those cells' identity.
        bm25_backend: ``rank_bm25`` or ``bm25s`` (same rankings; retrieval/retrievers.py).
        chat_template: a template of :data:`ratune.data.prompt.CHAT_TEMPLATES` for the prompts;
            None = the one the checkpoint was trained with (:func:`trained_chat_template`), else
            the tokenizer's own. A named one is recorded in each cell's identity.
        device: ``auto`` (``cuda`` when torch sees a GPU, else ``cpu``), ``cpu`` or ``cuda``
            (:func:`resolve_placement`).
        dtype: ``auto`` (``bfloat16`` on CUDA, ``float32`` on CPU), ``float32``, ``bfloat16`` or
            ``float16``. The resolved device and dtype are recorded in each cell's identity and
            metrics (``generation.device``, ``generation.dtype``).
    """

    settings: Sequence[str] = SETTINGS
    n_questions: int | None = None
    batch_size: int = 8
    max_new_tokens: int = 256
    stop_after_api_call: bool = False
    max_document_tokens: int | None = None
    torch_threads: int | None = None
    backend: str = "hf"
    trust_remote_code: bool = False
    dense_model: str | None = None
    bm25_backend: str = "rank_bm25"
    chat_template: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    retriever_cache: dict = field(default_factory=dict)


def resolve_placement(device: str = "auto", dtype: str = "auto", *, backend: str = "hf") -> tuple[str, str]:
    """The ``(device, dtype)`` an eval generates with.

    ``auto`` device: ``cuda`` when ``torch.cuda.is_available()``, else ``cpu``; ``auto`` dtype:
    ``bfloat16`` on CUDA, ``float32`` on CPU.

    Raises:
        RatuneError: an unknown device or dtype, ``cuda`` asked for where torch sees no CUDA
            device, or the vLLM backend (CUDA only) with ``cpu``.
    """
    import torch

    if device not in DEVICES:
        raise RatuneError(f"unknown eval device {device!r}: expected one of {', '.join(DEVICES)}")
    if dtype not in DTYPES:
        raise RatuneError(f"unknown eval dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    cuda = torch.cuda.is_available()
    if device == "auto":
        device = "cuda" if cuda else "cpu"
    elif device == "cuda" and not cuda:
        raise RatuneError(f"--device cuda, but torch {torch.__version__} sees no CUDA device (torch.version.cuda "
                          f"{torch.version.cuda}); install a CUDA build of torch that matches the driver, or use "
                          "--device cpu")
    if backend == "vllm" and device != "cuda":
        raise RatuneError("the vLLM backend generates on CUDA only: --device cpu contradicts --backend vllm")
    if dtype == "auto":
        dtype = "bfloat16" if device == "cuda" else "float32"
    return device, dtype


def _with_placement(identity: dict) -> dict:
    """``identity`` with the device and dtype a cell made before they were recorded ran with."""
    generation = identity.get("generation")
    if not isinstance(generation, dict) or "device" in generation:
        return identity
    legacy = _LEGACY_PLACEMENT.get(generation.get("backend", "hf"), {})
    return {**identity, "generation": {**generation, **legacy}}


def _device_name(device: str) -> str:
    """The GPU's name on ``cuda`` (``torch.cuda.get_device_name``), ``cpu`` otherwise."""
    if device != "cuda":
        return "cpu"
    import torch

    return torch.cuda.get_device_name()


def model_folder(checkpoint: str | os.PathLike) -> Path:
    """The model folder of a checkpoint: a ``ratune train`` run folder (its ``model/``) or a
    folder with config.json itself.

    Raises:
        RatuneError: when neither holds a config.json.
    """
    path = Path(checkpoint)
    if (path / "model" / "config.json").exists():
        return path / "model"
    if (path / "config.json").exists():
        return path
    raise RatuneError(f"{path}: not a checkpoint (no config.json, and no model/config.json of a ratune run)")


def trained_document_budget(checkpoint: str | os.PathLike) -> int | None:
    """The max_document_tokens the checkpoint's training data was built with, if recorded."""
    manifest = Path(checkpoint) / "manifest.json"
    if manifest.exists():
        return json.loads(manifest.read_text()).get("prompt", {}).get("max_document_tokens")
    return None


def trained_chat_template(checkpoint: str | os.PathLike) -> str | None:
    """The chat template name the checkpoint was trained with, from its run manifest (a run
    folder's ``manifest.json`` or a model folder's ``ratune_manifest.json``): ``prompt.chat_template``,
    else the training config's ``chat_template``; None when not recorded (the tokenizer's own)."""
    path = Path(checkpoint)
    for manifest in (path / "manifest.json", path / "ratune_manifest.json", path / "model" / "ratune_manifest.json"):
        if manifest.exists():
            data = json.loads(manifest.read_text())
            prompt = data.get("prompt") or {}
            if "chat_template" in prompt:
                return prompt["chat_template"]
            return (data.get("config") or {}).get("chat_template")
    return None


def _check_cell_identity(cell: Path, identity: dict) -> None:
    """Record what a cell is computed from (``cell/identity.json``); refuse to continue or reuse a
    cell made from another checkpoint, question set or generation settings.

    Raises:
        RatuneError: naming the cell and the keys that differ.
    """
    from ratune.io import read_json, write_json

    path = cell / "identity.json"
    if path.exists():
        previous, identity = _with_placement(read_json(path)), _with_placement(identity)
        changed = sorted(k for k in set(previous) | set(identity) if previous.get(k) != identity.get(k))
        if changed:
            raise RatuneError(f"{cell}: this eval cell was made with different {', '.join(changed)}; "
                              "choose another --out folder (or delete the cell to redo it)")
        return
    cell.mkdir(parents=True, exist_ok=True)
    write_json(path, identity)


def _read_done(path: Path) -> dict[int, dict]:
    """Complete lines of a partly written responses file (a torn last line is dropped)."""
    done = {}
    if not path.exists():
        return done
    with open(path, "rb") as fh:
        data = fh.read()
    keep = data[:data.rfind(b"\n") + 1]  # a line without its newline was cut mid-write
    if len(keep) != len(data):
        with open(path, "wb") as fh:
            fh.write(keep)
    for line in keep.decode("utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            done[row["question_id"]] = row
    return done


def _batches(backend: str, model, tokenizer, prompts, *, batch_size: int, max_new_tokens: int,
             stop_after_api_call: bool):
    """Batches of ``(prompt index, answer)`` from the chosen backend (same arguments, same answers)."""
    if backend == "vllm":
        from ratune.eval.vllm_backend import vllm_generate_batches

        # vLLM schedules its own batches; chunks of 32 x batch_size bound what a killed run loses
        return vllm_generate_batches(model, tokenizer, prompts, max_new_tokens=max_new_tokens,
                                     stop_after_api_call=stop_after_api_call, chunk_size=32 * batch_size)
    from ratune.eval.generate import generate_batches

    return generate_batches(model, tokenizer, prompts, batch_size=batch_size, max_new_tokens=max_new_tokens,
                            stop_after_api_call=stop_after_api_call)


def _setting_plan(setting: str, examples: list, *, hub: str, apibench_dir, settings: EvalSettings):
    """``(examples, retriever, extra)`` of one setting: the questions it asks, the retriever that
    gives their documents, and what its extra metrics need (``swapped`` / ``constraints``)."""
    from ratune.data.apibench import api_database_path, load_api_database
    from ratune.retrieval.retrievers import TEST_SETTINGS, Query, make_retriever

    def cached(name: str):
        key = (hub, name)
        if key not in settings.retriever_cache:
            if name == "swap":
                from ratune.eval.swap import SwapRetriever

                settings.retriever_cache[key] = SwapRetriever(load_api_database(api_database_path(apibench_dir, hub)))
            elif name == "irrelevant":
                from ratune.eval.abstain import IrrelevantRetriever

                settings.retriever_cache[key] = IrrelevantRetriever(
                    load_api_database(api_database_path(apibench_dir, hub)))
            else:
                settings.retriever_cache[key] = make_retriever(
                    name, hub=hub, apibench_dir=apibench_dir, bm25_backend=settings.bm25_backend,
                    dense_model=settings.dense_model if name == "dense_ft" else None)
        return settings.retriever_cache[key]

    if setting in TEST_SETTINGS:
        return examples, cached(TEST_SETTINGS[setting]), {}
    if setting == "swap":
        retriever = cached("swap")
        swapped = {}
        for e in examples:
            doc = retriever.swapped(Query(text=e.instruction, gold=e.api, question_id=e.line))
            if doc is not None:
                swapped[e.line] = doc
        return [e for e in examples if e.line in swapped], retriever, {"swapped": swapped}
    if setting == "irrelevant":
        return examples, cached("irrelevant"), {}
    from ratune.eval.constraints import constrained_examples

    made = constrained_examples(examples, load_api_database(api_database_path(apibench_dir, hub)))
    base = setting[len("constraints_"):]
    return [e for e, _ in made], cached(TEST_SETTINGS[base]), {"constraints": {e.line: c for e, c in made}}


def evaluate_checkpoint(checkpoint: str | os.PathLike, *, hub: str, apibench_dir, out_dir: str | os.PathLike,
                        settings: EvalSettings, model_name: str | None = None, progress: bool = True) -> dict:
    """Generate and score one checkpoint under each test setting.

    Returns:
        ``{setting: metrics}`` (each as written to ``{setting}/metrics.json``).
    Raises:
        RatuneError: unknown setting, bad checkpoint.
    """
    from tqdm.auto import tqdm

    from ratune.data.apibench import load_examples
    from ratune.data.prompt import encode_prompt, render_user_turn
    from ratune.eval.abstain import abstention
    from ratune.eval.scoring import Scorer
    from ratune.eval.stats import rate_intervals
    from ratune.io import write_json
    from ratune.manifest import is_complete, mark_complete, package_versions
    from ratune.retrieval.retrievers import Query
    from ratune.train.model import load_model, load_tokenizer, set_torch_threads

    known = TABLE_SETTINGS + EXPERIMENT_SETTINGS
    for s in settings.settings:
        if s not in known:
            raise RatuneError(f"unknown test setting {s!r}: expected one of {', '.join(known)}")
        if s.startswith("constraints_") and hub != "torchhub":
            raise RatuneError(f"test setting {s}: constrained questions exist for torchhub only")
    if any(s.endswith("dense_ft") for s in settings.settings):
        from ratune.retrieval.retrievers import require_finetuned_retriever

        require_finetuned_retriever(settings.dense_model, hub, "the dense_ft test setting")
    if settings.backend not in BACKENDS:
        raise RatuneError(f"unknown generation backend {settings.backend!r}: expected one of {', '.join(BACKENDS)}")
    if settings.backend == "vllm":
        from ratune.eval.vllm_backend import require_vllm

        require_vllm()  # before any question is loaded or cell written
    device, dtype = resolve_placement(settings.device, settings.dtype, backend=settings.backend)
    set_torch_threads(settings.torch_threads)
    folder = model_folder(checkpoint)
    budget = settings.max_document_tokens
    if budget is None:
        budget = trained_document_budget(checkpoint)
    all_examples = load_examples(apibench_dir, hub, "eval")
    if settings.n_questions is not None:
        all_examples = all_examples[:settings.n_questions]
    name = model_name or Path(checkpoint).name
    out = Path(out_dir)
    scorer = Scorer.from_apibench(hub, apibench_dir)

    # the prompts are rendered with the template the model was trained with (run manifest)
    chat_template = settings.chat_template or trained_chat_template(checkpoint)
    tokenizer = load_tokenizer(folder, trust_remote_code=settings.trust_remote_code, chat_template=chat_template)
    from ratune.data.prompt import require_chat_template

    require_chat_template(tokenizer, source=str(folder), hint="give --chat-template (the one it was trained with)")
    from ratune.data.apibench import api_database_path, examples_path, input_hashes
    from ratune.io import sha256_file

    inputs = input_hashes([api_database_path(apibench_dir, hub), examples_path(apibench_dir, hub, "eval")])
    run_manifest = folder / "ratune_manifest.json"
    if run_manifest.exists():  # the checkpoint's own run manifest (versions, data hashes, recipe)
        inputs["checkpoint ratune_manifest.json"] = sha256_file(run_manifest)
    model = None
    results = {}
    generation = {"batch_size": settings.batch_size, "max_new_tokens": settings.max_new_tokens,
                  "stop_after_api_call": settings.stop_after_api_call, "greedy": True,
                  "max_document_tokens": budget, "device": device, "dtype": dtype}
    if chat_template is not None:  # cells of a tokenizer's own template keep their identity
        generation["chat_template"] = chat_template
    if settings.backend != "hf":  # cells made before backends existed keep their identity
        generation["backend"] = settings.backend
    for setting in settings.settings:
        cell = out / setting
        examples, retriever, extra = _setting_plan(setting, all_examples, hub=hub, apibench_dir=apibench_dir,
                                                   settings=settings)
        identity = {"checkpoint": str(folder.resolve()), "hub": hub, "setting": setting,
                    "questions": [e.line for e in examples], "generation": generation}
        if setting.endswith("dense_ft"):  # which finetuned retriever gave the documents
            identity["retriever_model"] = str(Path(settings.dense_model).resolve())
        _check_cell_identity(cell, identity)
        if is_complete(cell):
            results[setting] = json.loads((cell / "metrics.json").read_text())
            continue
        cell.mkdir(parents=True, exist_ok=True)
        docs = retriever.retrieve([Query(text=e.instruction, gold=e.api, question_id=e.line) for e in examples],
                                  top_k=1)

        def count(text: str) -> int:
            return len(tokenizer(text, add_special_tokens=False)["input_ids"])

        responses_path = cell / "responses.jsonl"
        done = _read_done(responses_path)
        todo = [i for i, e in enumerate(examples) if e.line not in done]
        prompts = [encode_prompt(tokenizer, render_user_turn(examples[i].instruction, docs[i],
                                                             max_document_tokens=budget, count_tokens=count)[0])
                   for i in todo]
        if todo:
            if model is None:
                if settings.backend == "vllm":
                    from ratune.eval.vllm_backend import load_llm

                    model = load_llm(folder, dtype=dtype)
                else:
                    model = load_model(folder, dtype=dtype, device=device,
                                       trust_remote_code=settings.trust_remote_code)
            bar = tqdm(total=len(examples), initial=len(examples) - len(todo), desc=f"{name} {setting}",
                       disable=not progress)
            with open(responses_path, "a", encoding="utf-8") as fh:
                for batch in _batches(settings.backend, model, tokenizer, prompts, batch_size=settings.batch_size,
                                      max_new_tokens=settings.max_new_tokens,
                                      stop_after_api_call=settings.stop_after_api_call):
                    for j, text in batch:
                        ex = examples[todo[j]]
                        row = {"question_id": ex.line, "text": text, "model": name, "setting": setting}
                        fh.write(json.dumps(row, ensure_ascii=False) + "\n")
                        done[ex.line] = row
                    fh.flush()
                    os.fsync(fh.fileno())
                    bar.update(len(batch))
            bar.close()
        responses = [done[e.line] for e in examples]
        if todo:  # generation wrote in batch order; the final file is in question_id order
            from ratune.io import atomic_write

            with atomic_write(responses_path) as fh:
                for row in sorted(done.values(), key=lambda r: r["question_id"]):
                    fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        scored = scorer.score(responses)
        for metric in ("gorilla", "strict"):  # every rate carries its 95 % Wilson interval
            scored[metric].update(rate_intervals(scored[metric], scored["n"]))
        gorilla = scored["gorilla"]
        metrics = {
            "hub": hub, "model": name, "setting": setting, "retriever": retriever.metadata(), "n": scored["n"],
            "accuracy": gorilla["accuracy"], "hallucination": gorilla["hallucination"], "error": gorilla["error"],
            **{k: gorilla[k] for k in ("accuracy_ci", "hallucination_ci", "error_ci")},
            "gorilla": gorilla, "strict": scored["strict"], "parser": scored["parser"],
            "per_question": scored.get("per_question", []),
            "generation": generation,
            "device_name": _device_name(device),
            "versions": package_versions(),
            "abstention": abstention(responses),
            "inputs": inputs,
        }
        if setting == "swap":
            from ratune.eval.swap import follow_rates

            metrics["document_swap"] = {**follow_rates(scorer, responses, extra["swapped"]),
                                        "left_out": len(all_examples) - len(examples)}
        elif setting.startswith("constraints_"):
            from ratune.eval.constraints import constraint_metrics

            metrics["constraints"] = {**constraint_metrics(scorer, responses, extra["constraints"]),
                                      "unconstrained_left_out": len(all_examples) - len(examples)}
        write_json(cell / "metrics.json", metrics)
        mark_complete(cell)
        results[setting] = metrics
    return results
