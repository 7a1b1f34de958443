"""The eval stage: generate answers for eval questions under each test-time retrieval setting,
store them in the shape of the paper's released response files, and score them. Output folder,
checkpoints, placement and length policy: docs/pipeline.md#eval.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ratune.sources.apibench import input_hashes
from ratune.hubs import Hub, as_hub_source
from ratune.sources.formats import DEFAULT_ANSWER_FORMAT, get_answer_format
from ratune.sources.prompt import encode_prompt, require_chat_template, use_chat_template
from ratune.errors import RatuneError
from ratune.eval.abstain import abstention
from ratune.eval.constraints import constrained_examples, constraint_metrics
from ratune.eval.generate import generate_batches, generation_limits, max_positions_of
from ratune.eval.hub_scoring import scoring_for
from ratune.eval.resume import append_responses, check_cell_identity, read_done
from ratune.eval.report import read_metrics
from ratune.eval.settings import EvalSettings, needs_finetuned_retriever, resolve_placement
from ratune.eval.stats import rate_intervals
from ratune.eval.swap import follow_rates
from ratune.io import read_json_object, sha256_file, write_json
from ratune.manifest import EVAL_RUN_STAGE, base_manifest, host_facts, is_complete, package_versions
from ratune.output import StageOutput
from ratune.models import load_adapter_merged, load_model, load_tokenizer, require_model_files, set_torch_threads
from ratune.registry import (CONSTRAINTS_PREFIX, RETRIEVERS,
                             TEST_SETTINGS, setting_retriever)
from ratune.retrieval.perturbed import IrrelevantRetriever, SwapRetriever
from ratune.retrieval.dense import require_held_out
from ratune.retrieval.retrievers import Query, make_retriever, require_finetuned_retriever
from ratune.eval.questions import questions, split_refusal
from ratune.train.layout import (Checkpoint, resolve_checkpoint, trained_answer_format, trained_chat_template,
                                 trained_document_budget)



def _device_name(device: str) -> str:
    """The GPU's name on ``cuda`` (``torch.cuda.get_device_name``), ``cpu`` otherwise."""
    if device != "cuda":
        return "cpu"
    import torch

    return torch.cuda.get_device_name()


def backend_batches(backend: str, model, tokenizer, prompts, *, batch_size: int, max_new_tokens: int,
                    stop_after_api_call: bool, max_positions: int | None, answer_format: str = "apibench"):
    """Batches of ``(prompt index, answer)`` from the chosen backend (``hf`` or ``vllm``; same
    arguments, same answers)."""
    if backend == "vllm":
        from ratune.eval.vllm_backend import vllm_generate_batches

        # vLLM schedules its own batches; chunks of 32 x batch_size bound what a killed run loses
        return vllm_generate_batches(model, tokenizer, prompts, max_new_tokens=max_new_tokens,
                                     max_positions=max_positions, stop_after_api_call=stop_after_api_call,
                                     chunk_size=32 * batch_size, answer_format=answer_format)
    return generate_batches(model, tokenizer, prompts, batch_size=batch_size, max_new_tokens=max_new_tokens,
                            stop_after_api_call=stop_after_api_call, max_positions=max_positions,
                            answer_format=answer_format)


def checkpoint_max_positions(source: Checkpoint, *, trust_remote_code: bool = False) -> int | None:
    """:func:`ratune.eval.generate.max_positions_of` the checkpoint's config (an adapter's: its
    base's), the length limit both backends generate within.

    Raises:
        RatuneError: the config file is missing or unreadable.
        ValueError: transformers' refusal of a config that needs the checkpoint's own code
            without ``trust_remote_code``.
    """
    from transformers import AutoConfig

    where = source.base or source.folder
    try:  # a config that needs its own code raises transformers' ValueError, as load_model does
        config = AutoConfig.from_pretrained(str(where), trust_remote_code=trust_remote_code)
    except OSError as exc:
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise RatuneError(f"{where}: cannot read the model config ({type(exc).__name__}: {first})") from None
    return max_positions_of(config)


def _setting_plan(setting: str, examples: list, *, source, settings: EvalSettings):
    """``(examples, retriever, extra)`` of one setting: the questions it asks, the retriever that
    gives their documents, and what its extra metrics need (``swapped`` / ``constraints``).
    ``source`` is the hub's :class:`~ratune.hubs.Hub`."""
    def cached(name: str):
        key = (str(source.root.resolve()), source.name, name)
        if key not in settings.retriever_cache:
            if name == "swap":
                settings.retriever_cache[key] = SwapRetriever(source.load_api_database())
            elif name == "irrelevant":
                settings.retriever_cache[key] = IrrelevantRetriever(source.load_api_database())
            else:
                settings.retriever_cache[key] = make_retriever(
                    name, hub=source, bm25_backend=settings.bm25_backend,
                    dense_model=settings.dense_model if RETRIEVERS[name].needs_model else None)
        return settings.retriever_cache[key]

    if setting in TEST_SETTINGS:
        return examples, cached(setting_retriever(setting)), {}
    if setting == "swap":
        retriever = cached("swap")
        swapped = {}
        for e in examples:
            doc = retriever.swapped(Query.of(e))
            if doc is not None:
                swapped[e.line] = doc
        return [e for e in examples if e.line in swapped], retriever, {"swapped": swapped}
    if setting == "irrelevant":
        return examples, cached("irrelevant"), {}
    made = constrained_examples(examples, source.load_api_database())
    return [e for e, _ in made], cached(setting_retriever(setting)), {"constraints": {e.line: c for e, c in made}}


def evaluate_checkpoint(checkpoint: str | os.PathLike, *, hub, apibench_dir, out_dir: str | os.PathLike,
                        settings: EvalSettings, model_name: str | None = None, progress: bool = True) -> dict:
    """Generate and score one checkpoint under each test setting into ``out_dir`` (a
    :class:`ratune.output.StageOutput`, locked throughout); every check that needs no model runs
    before a cell is written. ``hub``: an APIBench hub name, a catalog folder or a
    :class:`~ratune.hubs.Hub`; ``model_name``: ``--model-name``. Returns ``{setting: metrics}``.

    Raises:
        RatuneError: unknown setting, a setting the hub does not have (``gpt_index`` and
            ``released_bm25`` replay the paper's documents, APIBench only; ``constraints_*`` are
            TorchHub's), bad checkpoint, an ``out_dir`` that exists, is not empty and is not a
            ratune eval output (:meth:`ratune.output.StageOutput.check`).
        LockHeld: another process is writing ``out_dir``.
    """
    output = StageOutput(out_dir, EVAL_RUN_STAGE, command=EVAL_RUN_STAGE, claim=False)
    with output.writing():
        return _evaluate_into(output, checkpoint, hub=hub, apibench_dir=apibench_dir, settings=settings,
                              model_name=model_name, progress=progress)


def _evaluate_into(output: StageOutput, checkpoint: str | os.PathLike, *, hub, apibench_dir, settings: EvalSettings,
                   model_name: str | None, progress: bool) -> dict:
    """The body of :func:`evaluate_checkpoint`, under ``output``'s lock."""
    request = resolve_eval_request(checkpoint, hub, apibench_dir, settings)
    run = _EvalRun.prepare(request, checkpoint, settings, model_name=model_name, progress=progress)
    output.claim()
    results = {}
    for setting in settings.settings:
        cell = output.out / setting
        examples, retriever, extra = _setting_plan(setting, run.all_examples, source=request.hub, settings=settings)
        if not examples:  # never a complete cell of n = 0 (a report would show it as 0.0)
            raise RatuneError(f"test setting {setting}: none of the {len(run.all_examples)} eval questions qualifies "
                              "(swap needs another API of the question's domain, constraints_* a constrained "
                              "question); not writing an empty cell: evaluate more questions or drop the setting")
        check_cell_identity(cell, run.identity(setting, examples))
        if is_complete(cell):
            results[setting] = read_metrics(cell / "metrics.json")
            continue
        cell.mkdir(parents=True, exist_ok=True)
        metrics = run.evaluate_cell(cell, setting, examples, retriever, extra)
        write_json(cell / "metrics.json", metrics)
        output.complete(cell)
        results[setting] = metrics
    _write_eval_manifest(output.out, checkpoint=request.checkpoint.folder, hub=request.hub.name, inputs=run.inputs,
                         generation=run.generation, results=results)
    return results


@dataclass
class _EvalRun:
    """What every cell of one ``ratune eval run`` shares: the request, the eval questions, their
    scoring, the tokenizer with the trained chat template, the generation record and, once a cell
    needs it, the model."""

    request: "EvalRequest"
    settings: EvalSettings
    name: str
    all_examples: list
    scoring: object
    tokenizer: object
    budget: int | None
    positions: int | None
    inputs: dict
    generation: dict
    answer_format: object
    progress: bool
    split_record: dict | None = None
    model: object = None

    @classmethod
    def prepare(cls, request: "EvalRequest", checkpoint, settings: EvalSettings, *, model_name: str | None,
                progress: bool) -> "_EvalRun":
        """Read the questions, the tokenizer and the prompt settings the checkpoint was trained with."""
        hub_source, source = request.hub, request.checkpoint
        set_torch_threads(settings.torch_threads)
        described_by = source.run or checkpoint  # the run manifest that holds the prompt settings
        budget = settings.max_document_tokens
        if budget is None:
            budget = trained_document_budget(described_by)
        for setting in settings.settings:
            refusal = split_refusal(setting, settings.split)
            if refusal:
                raise RatuneError(refusal)
        all_examples, split_record, held = questions(hub_source, settings.split, described_by)
        needs_model = [s for s in settings.settings if needs_finetuned_retriever(s)]
        if held is not None and needs_model:  # validation questions: the retriever must not know them
            require_held_out(settings.dense_model, held, hub=hub_source.ref,
                             train_path=hub_source.examples_file("train"),
                             what=f"test setting {needs_model[0]} on validation questions")
        if settings.n_questions is not None:
            all_examples = all_examples[:settings.n_questions]
        name = model_name or (f"{source.run.name}-step{source.step}" if source.step is not None
                              else Path(checkpoint).name)
        # the prompts are rendered with the template the model was trained with (run manifest)
        chat_template = settings.chat_template or trained_chat_template(described_by)
        tokenizer = use_chat_template(load_tokenizer(source.folder, trust_remote_code=settings.trust_remote_code),
                                      chat_template)
        require_chat_template(tokenizer, source=str(source.folder),
                              hint="give --chat-template (the one it was trained with)")
        # validation questions are training examples the data build held out: their file is the train one
        inputs = input_hashes(hub_source.input_files(["train" if settings.split == "validation" else "eval"]))
        run_manifest = source.folder / "ratune_manifest.json"
        if run_manifest.exists():  # the checkpoint's own run manifest (versions, data hashes, recipe)
            inputs["checkpoint ratune_manifest.json"] = sha256_file(run_manifest)
        # the format the training rows were written in (run manifest), reading the tokenizer's answers
        answer_format = get_answer_format(hub_source.choose_answer_format(
            settings.answer_format or trained_answer_format(described_by)))
        answer_format.check_tokenizer(tokenizer)
        answer_format = answer_format.reading(tokenizer)
        return cls(request=request, settings=settings, name=name, all_examples=all_examples,
                   scoring=scoring_for(hub_source, all_examples, answer_format), tokenizer=tokenizer, budget=budget,
                   positions=checkpoint_max_positions(source, trust_remote_code=settings.trust_remote_code),
                   inputs=inputs, generation=_generation_record(settings, request, budget, chat_template, answer_format),
                   answer_format=answer_format, progress=progress, split_record=split_record)

    def identity(self, setting: str, examples: list) -> dict:
        """What a cell was computed from (a rerun with anything else is refused)."""
        source = self.request.checkpoint
        identity = {"checkpoint": str(source.folder.resolve()), "hub": self.request.hub.name, "setting": setting,
                    "questions": [e.line for e in examples], "generation": self.generation}
        if needs_finetuned_retriever(setting):  # which finetuned retriever gave the documents
            identity["retriever_model"] = str(Path(self.settings.dense_model).resolve())
        if source.base is not None:  # an adapter: the base it is merged into
            identity["adapter_base"] = source.base
        if source.step is not None:  # a Trainer checkpoint: the point of the learning curve
            identity["step"] = source.step
        if self.split_record is not None:  # validation questions: which build held them out
            identity.update(self.split_record)
        return identity

    def prompts(self, examples: list, docs: list) -> list[list[int]]:
        """The prompt ids of ``examples`` with their documents, in the hub's answer format."""
        def count(text: str) -> int:
            return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

        rendered = [self.answer_format.prompt(e, docs[i], max_document_tokens=self.budget, count_tokens=count)
                    for i, e in enumerate(examples)]
        return [encode_prompt(self.tokenizer, p.user_turn, p.system, p.tools) for p in rendered]

    def batches(self, todo):
        """Generated answers to ``todo`` prompts, batch by batch (the model loads on first use)."""
        request, settings = self.request, self.settings
        if self.model is None:
            self.model = load_for_generation(request.checkpoint, backend=settings.backend, dtype=request.dtype,
                                             device=request.device, positions=self.positions,
                                             trust_remote_code=settings.trust_remote_code)
        return backend_batches(settings.backend, self.model, self.tokenizer, todo, batch_size=settings.batch_size,
                               max_new_tokens=settings.max_new_tokens, stop_after_api_call=settings.stop_after_api_call,
                               max_positions=self.positions, answer_format=self.answer_format.name)

    def evaluate_cell(self, cell: Path, setting: str, examples: list, retriever, extra: dict) -> dict:
        """Generate (or continue) a cell's answers and return its metrics."""
        settings = self.settings
        prompts = self.prompts(examples, retriever.retrieve([Query.of(e) for e in examples], top_k=1))
        # the length policy of both backends, checked before the model is loaded
        limits = generation_limits([len(p) for p in prompts], max_new_tokens=settings.max_new_tokens,
                                   max_positions=self.positions,
                                   names=[f"{setting} question {e.line}" for e in examples])
        responses_path = cell / "responses.jsonl"
        responses = append_responses(responses_path, read_done(responses_path), [e.line for e in examples], prompts,
                                     batches=self.batches, meta={"model": self.name, "setting": setting},
                                     desc=f"{self.name} {setting}", progress=self.progress)
        metrics = _cell_metrics(self.scoring.score(responses), scoring=self.scoring, responses=responses,
                                head={"hub": self.request.hub.name, "model": self.name, "setting": setting,
                                      "retriever": retriever.metadata(),
                                      **({"split": settings.split} if settings.split != "eval" else {})},
                                generation=self.generation, device=self.request.device, inputs=self.inputs,
                                positions=self.positions,
                                capped=[e.line for e, n in zip(examples, limits) if n < settings.max_new_tokens])
        metrics.update(self._cell_extras(setting, responses, examples, extra))
        return metrics

    def _cell_extras(self, setting: str, responses: list, examples: list, extra: dict) -> dict:
        """The metrics a Trainer checkpoint, an adapter, the swap or a constraints setting adds."""
        source, out, left_out = self.request.checkpoint, {}, len(self.all_examples) - len(examples)
        if source.step is not None:
            out["train_step"] = source.step
        if source.base is not None:
            out["adapter"] = {"base": source.base, "base_trained_in_4bit": source.base_in_4bit,
                              "evaluated_on": f"the unquantized base in {self.request.dtype}, adapter merged"}
        if setting == "swap":
            out["document_swap"] = {**follow_rates(self.scoring.scorer, responses, extra["swapped"]),
                                    "left_out": left_out}
        elif setting.startswith(CONSTRAINTS_PREFIX):
            out["constraints"] = {**constraint_metrics(self.scoring.scorer, responses, extra["constraints"]),
                                  "unconstrained_left_out": left_out}
        return out


def _generation_record(settings: EvalSettings, request: "EvalRequest", budget, chat_template, answer_format) -> dict:
    """How a run's answers are generated (every cell's identity and metrics record it)."""
    generation = {"batch_size": settings.batch_size, "max_new_tokens": settings.max_new_tokens,
                  "stop_after_api_call": settings.stop_after_api_call, "greedy": True,
                  "max_document_tokens": budget, "device": request.device, "dtype": request.dtype}
    if chat_template is not None:  # cells of a tokenizer's own template keep their identity
        generation["chat_template"] = chat_template
    if settings.backend != "hf":  # cells made before backends existed keep their identity
        generation["backend"] = settings.backend
    if answer_format.name != DEFAULT_ANSWER_FORMAT:  # APIBench and catalog cells keep their identity
        generation.update(answer_format.record())  # tool_calls: with the response template that reads it
    return generation


@dataclass(frozen=True)
class EvalRequest:
    """An eval request that :func:`resolve_eval_request` resolved: the hub, the checkpoint and where
    it generates."""

    hub: Hub
    checkpoint: Checkpoint
    device: str
    dtype: str


def resolve_eval_request(checkpoint: str | os.PathLike, hub, apibench_dir, settings: EvalSettings) -> EvalRequest:
    """The one preflight of an eval request: every refusal of an impossible combination, before any
    file is read or written and before any model loads.

    Raises:
        RatuneError: a setting the hub does not have; a finetuned-retriever setting without its
            folder, or with one for another hub; those of :func:`resolve_generation`.
    """
    hub_source = as_hub_source(hub, apibench_dir)
    hub_source.check_settings(settings.settings)
    needs_model = [s for s in settings.settings if needs_finetuned_retriever(s)]
    if needs_model:
        require_finetuned_retriever(settings.dense_model, hub_source.name, f"the {needs_model[0]} test setting")
    source, device, dtype = resolve_generation(checkpoint, backend=settings.backend, device=settings.device,
                                               dtype=settings.dtype)
    return EvalRequest(hub=hub_source, checkpoint=source, device=device, dtype=dtype)


def resolve_generation(checkpoint: str | os.PathLike, *, backend: str, device: str, dtype: str
                       ) -> tuple[Checkpoint, str, str]:
    """``(checkpoint, device, dtype)`` a checkpoint generates with (:func:`resolve_checkpoint`,
    :func:`resolve_placement`), checked before any model loads.

    Raises:
        RatuneError: the vLLM backend where vLLM is not installed, or for a run that saved only its
            LoRA adapter; a device or dtype that cannot be had here; a checkpoint without its weights
            (safetensors) or tokenizer, or an adapter without its base.
    """
    if backend == "vllm":
        from ratune.eval.vllm_backend import require_vllm  # an optional extra

        require_vllm()
    device, dtype = resolve_placement(device, dtype, backend=backend)
    source = resolve_checkpoint(checkpoint)
    if source.base is not None and backend == "vllm":
        raise RatuneError(f"{checkpoint}: this run saved only its LoRA adapter (adapter/, no merged model/); the vLLM "
                          "backend loads model folders: merge it first (ratune export RUN --out DIR --merge-lora) "
                          "and evaluate DIR, or use the HF backend")
    require_model_files(source.folder)  # weights (safetensors only) and tokenizer, before any cell is written
    if source.base is not None:
        require_model_files(source.base, tokenizer=False)  # the adapter's base (a hub id passes)
    return source, device, dtype


def load_for_generation(source: Checkpoint, *, backend: str, dtype: str, device: str, positions,
                        trust_remote_code: bool = False):
    """The model to generate with: a vLLM engine (``backend`` ``vllm``), an adapter merged into its
    unquantized base (:func:`ratune.models.load_adapter_merged`), or the model folder."""
    if backend == "vllm":
        from ratune.eval.vllm_backend import load_llm  # an optional extra

        return load_llm(source.folder, dtype=dtype, max_positions=positions, trust_remote_code=trust_remote_code)
    if source.base is not None:
        return load_adapter_merged(source.base, source.folder, dtype=dtype, device=device,
                                   trust_remote_code=trust_remote_code)
    return load_model(source.folder, dtype=dtype, device=device, trust_remote_code=trust_remote_code)


def _cell_metrics(scored: dict, *, scoring, responses: list[dict], head: dict, generation: dict, device: str,
                  inputs: dict, positions, capped: list[int]) -> dict:
    """A cell's metrics.json from the scorer's result: every rate with its 95 % Wilson interval; the
    top-level rates the hub's headline metric's (:class:`ratune.eval.hub_scoring.HubScoring`), a
    block per metric and the scoring's own fields; generation settings, device, versions,
    abstention, input hashes and the questions whose prompt left fewer than max_new_tokens
    positions (``capped``)."""
    for metric in scoring.metrics:
        scored[metric].update(rate_intervals(scored[metric], scored["n"]))
    main = scored[scoring.main_metric]
    metrics = {
        **head, "n": scored["n"],
        "accuracy": main["accuracy"], "hallucination": main["hallucination"], "error": main["error"],
        **{k: main[k] for k in ("accuracy_ci", "hallucination_ci", "error_ci")},
        **{m: scored[m] for m in scoring.metrics}, "parser": scored["parser"],
        "per_question": scored.get("per_question", []),
        "generation": generation,
        "device_name": _device_name(device), "host": host_facts(),
        "versions": package_versions(),
        "abstention": abstention(responses),
        "inputs": inputs,
        # ratune.eval.generate.generation_limits
        "generation_limit": {"max_positions": positions, "capped": capped},
    }
    metrics.update(scoring.cell_fields(scored))
    return metrics


def _write_eval_manifest(out: Path, *, checkpoint: Path, hub: str, inputs: dict, generation: dict,
                         results: dict) -> None:
    """``out/manifest.json``, as every stage writes: versions, git commit, the checkpoint, input
    hashes, generation settings and, per finished cell, the sha256 of its metrics.json (cells of
    earlier runs into the same folder are kept)."""
    path = out / "manifest.json"
    cells = read_json_object(path).get("cells", {}) if path.exists() else {}
    cells.update({s: sha256_file(out / s / "metrics.json") for s in results})
    write_json(path, {**base_manifest(EVAL_RUN_STAGE), "checkpoint": str(checkpoint.resolve()), "hub": hub,
                      "inputs": inputs, "generation": generation, "cells": dict(sorted(cells.items()))})
