"""Cross-row data checks: duplicates, train/eval leakage, conflicting domains.

Small cases are written to files in a temporary APIBench folder and parsed with the real loader;
the real-data tests assert the counts measured on the released files.
"""

from __future__ import annotations

import json
import shutil

import pytest

from ratune.sources.apibench import (HUBS, api_database_path, examples_path, load_api_database, load_examples)
from ratune.sources.validate import (DOMAIN_RULE, NEAR_DUPLICATE_JACCARD, DomainConflict, LeakPair, ValidationReport,
                                  check_leakage, conflicting_domains, dedupe, drop_leaked, find_duplicates,
                                  find_leakage, jaccard, normalise, tokens, validate_splits)
from ratune.errors import RatuneError


# --------------------------------------------------------------------------------------------
# Small files made in the test


def _train_row(instruction: str, call: str = "torch.hub.load('a/b', 'm')", domain: str = "Classification") -> dict:
    code = (f"{{'Instruction': {instruction}, 'Output': {{'domain': '{domain}', 'api_call': \"{call}\", "
            f"'api_provider': 'PyTorch', 'explanation': 'x', 'code': 'y'}}}}")
    return {"code": code, "api_call": call, "provider": "PyTorch", "api_data": {"domain": domain, "api_call": call}}


def _eval_row(instruction: str, call: str = "torch.hub.load('a/b', 'm')", domain: str = "Classification") -> dict:
    code = f"###Instruction: {instruction}\n###Output: {{'domain': '{domain}', 'api_call': \"{call}\"}}"
    return {"code": code, "api_call": call, "provider": "PyTorch", "api_data": {"domain": domain, "api_call": call}}


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture
def bench(tmp_path):
    """A temporary APIBench folder; ``bench(train_rows, eval_rows)`` writes the TorchHub files."""
    (tmp_path / "api").mkdir()
    _write(tmp_path / "api" / "torchhub_api.jsonl", [{"domain": "Classification", "api_call": "torch.hub.load('a/b', 'm')"}])

    def make(train=None, eval_=None):
        if train is not None:
            _write(examples_path(tmp_path, "torchhub", "train"), train)
        if eval_ is not None:
            _write(examples_path(tmp_path, "torchhub", "eval"), eval_)
        return tmp_path

    return make


LONG = ("I am building a mobile app for my garden club and I need an API that can identify the species of a "
        "flower from a single photo")  # 24 tokens
LONG_ONE_WORD = LONG.replace("garden", "hiking")          # 1 substitution: 23/25 = 0.92
LONG_TWO_WORDS = LONG_ONE_WORD.replace("mobile", "web")  # 2 substitutions: 22/26 = 0.85
TEN = "Recommend an API that classifies bird songs in forest recordings"   # 10 tokens
NINE = "Recommend an API that classifies bird songs in recordings"          # 9 of them: 9/10 = 0.9


def test_normalise_and_tokens():
    assert normalise("  Find\tme an\n API.  ") == "find me an api."
    assert normalise("STRASSE") == normalise("strasse")
    assert tokens("Find me, an API: find!") == frozenset({"find", "me", "an", "api"})
    assert jaccard(tokens(LONG), tokens(LONG_ONE_WORD)) == pytest.approx(23 / 25)
    assert jaccard(tokens(LONG), tokens(LONG_TWO_WORDS)) == pytest.approx(22 / 26)
    assert jaccard(tokens(TEN), tokens(NINE)) == pytest.approx(0.9)
    assert jaccard(frozenset(), frozenset()) == 0.0


# --------------------------------------------------------------------------------------------
# Duplicates


def test_duplicates_small_file(bench):
    other = "torch.hub.load('c/d', 'n')"
    root = bench(train=[
        _train_row("Classify images of cats."),                 # 1
        _train_row("classify  images of CATS."),                # 2: dup of 1 (case, whitespace)
        _train_row("Classify images of cats.", call=other),     # 3: same text, other API: not a dup
        _train_row("Classify images of dogs."),                 # 4
        _train_row("Classify images of cats."),                 # 5: exact dup of 1
        _train_row("Classify images of cats!"),                 # 6: punctuation differs: not a dup
        _train_row("classify images of cats.", call="torch.hub.load('c/d','n')"),  # 7: dup of 3 (call spacing)
    ])
    examples = load_examples(root, "torchhub", "train")
    groups = find_duplicates(examples)
    assert [[e.line for e in g] for g in groups] == [[1, 2, 5], [3, 7]]
    kept, removed = dedupe(examples)
    assert [e.line for e in kept] == [1, 3, 4, 6]
    assert [e.line for e in removed] == [2, 5, 7]
    assert dedupe(kept) == (kept, [])


def test_real_torchhub_train_has_no_duplicates(apibench):
    train = load_examples(apibench, "torchhub", "train")
    assert find_duplicates(train) == []
    kept, removed = dedupe(train)
    assert len(kept) == 837 and removed == []


@pytest.mark.parametrize("hub", HUBS)
def test_real_eval_files_have_no_duplicates(apibench, hub):
    assert find_duplicates(load_examples(apibench, hub, "eval")) == []


def test_duplicates_injected_into_real_train_file(apibench, tmp_path):
    """Real rows 1 and 10 appended again (10 with case and whitespace changed) are found and removed."""
    lines = examples_path(apibench, "torchhub", "train").read_text(encoding="utf-8").splitlines()
    row10 = json.loads(lines[9])
    instruction = "Devise an API used to separate objects from the background in an image."
    assert instruction in row10["code"]
    row10["code"] = row10["code"].replace(instruction, "  DEVISE an API  used to separate\tobjects from the background "
                                                       "in an IMAGE.")
    _write(examples_path(tmp_path, "torchhub", "train"), [json.loads(x) for x in lines] + [json.loads(lines[0]), row10])
    train = load_examples(tmp_path, "torchhub", "train")
    assert train[-1].instruction != train[9].instruction  # really changed
    assert [[e.line for e in g] for g in find_duplicates(train)] == [[1, 838], [10, 839]]
    kept, removed = dedupe(train)
    assert len(kept) == 837 and [e.line for e in removed] == [838, 839]


# --------------------------------------------------------------------------------------------
# Leakage


def _leak_bench(bench):
    return bench(
        train=[_train_row("Find an API for depth estimation from one image."),   # 1
               _train_row(LONG),                                                   # 2
               _train_row("Recommend a model that transcribes speech, please."),  # 3
               _train_row(TEN),                                                    # 4
               _train_row("Find an API for depth estimation from one image.")],   # 5 (same as 1)
        eval_=[_eval_row("Find an API for depth estimation from one image."),     # 1: exact (train 1 and 5)
               _eval_row("recommend a MODEL that  transcribes speech, please."),  # 2: normalised (train 3)
               _eval_row(LONG_ONE_WORD),                                           # 3: near (train 2), 0.92
               _eval_row(LONG_TWO_WORDS),                                          # 4: 0.85, not leakage
               _eval_row(NINE),                                                    # 5: near (train 4), exactly 0.9
               _eval_row("Recommend a model that transcribes speech please"),     # 6: near (punctuation only), 1.0
               _eval_row("Something else entirely.")])                            # 7: clean


def test_leakage_kinds_small_files(bench):
    root = _leak_bench(bench)
    train, eval_ = load_examples(root, "torchhub", "train"), load_examples(root, "torchhub", "eval")
    pairs = find_leakage(train, eval_)
    assert [(p.train_line, p.eval_line, p.kind) for p in pairs] == [
        (1, 1, "exact"), (5, 1, "exact"), (3, 2, "normalised"), (2, 3, "near"), (4, 5, "near"), (3, 6, "near")]
    assert [round(p.similarity, 4) for p in pairs] == [1.0, 1.0, 1.0, round(23 / 25, 4), 0.9, 1.0]
    # exact and normalised only
    assert [(p.train_line, p.eval_line, p.kind) for p in find_leakage(train, eval_, near_threshold=None)] == [
        (1, 1, "exact"), (5, 1, "exact"), (3, 2, "normalised")]
    # a lower threshold catches the two-word edit too
    assert (2, 4) in {(p.train_line, p.eval_line) for p in find_leakage(train, eval_, near_threshold=0.8)}
    with pytest.raises(RatuneError, match="threshold"):
        find_leakage(train, eval_, near_threshold=0)


def test_check_leakage_error_names_file_lines(bench):
    root = _leak_bench(bench)
    train, eval_ = load_examples(root, "torchhub", "train"), load_examples(root, "torchhub", "eval")
    tp, ep = examples_path(root, "torchhub", "train"), examples_path(root, "torchhub", "eval")
    with pytest.raises(RatuneError) as err:
        check_leakage(train, eval_, train_path=tp, eval_path=ep)
    msg = str(err.value)
    assert "5 eval instruction(s) also in the training data, 6 pair(s)" in msg
    assert "2 exact, 1 normalised, 3 near" in msg
    assert f"{tp}:1 <-> {ep}:1 (exact" in msg
    assert f"{tp}:3 <-> {ep}:2 (normalised" in msg
    assert f"{tp}:2 <-> {ep}:3 (near, jaccard 0.92)" in msg
    assert "... and 1 more" in msg and f"{tp}:3 <-> {ep}:6" not in msg  # first five pairs only
    assert len(check_leakage(train, eval_, train_path=tp, eval_path=ep, allow=True)) == 6
    clean = [e for e in eval_ if e.line in (4, 7)]
    assert check_leakage(train, clean, train_path=tp, eval_path=ep) == []


def test_drop_leaked_keeps_eval_untouched(bench):
    root = _leak_bench(bench)
    train, eval_ = load_examples(root, "torchhub", "train"), load_examples(root, "torchhub", "eval")
    kept, pairs = drop_leaked(train, eval_)
    assert [e.line for e in kept] == []  # every training row leaks in this file
    assert len(pairs) == 6
    kept, pairs = drop_leaked(train, eval_[3:4])  # eval line 4 only: nothing leaks
    assert kept == train and pairs == []
    kept, pairs = drop_leaked(train, eval_[:2], near_threshold=None)
    assert [e.line for e in kept] == [2, 4] and len(pairs) == 3


def test_real_torchhub_has_no_leakage(apibench):
    train, eval_ = load_examples(apibench, "torchhub", "train"), load_examples(apibench, "torchhub", "eval")
    assert find_leakage(train, eval_) == []  # exact 0, normalised 0, near 0
    assert find_leakage(train, eval_, near_threshold=None) == []
    train_tokens = [tokens(t.instruction) for t in train]
    best = max(jaccard(tokens(e.instruction), t) for e in eval_ for t in train_tokens)
    assert best == pytest.approx(9 / 13)  # the closest pair (eval 54, train 799) is a different request
    assert best < NEAR_DUPLICATE_JACCARD


def test_prefix_filter_equals_all_pairs_on_real_data(apibench):
    train, eval_ = load_examples(apibench, "torchhub", "train"), load_examples(apibench, "torchhub", "eval")
    train_tokens = [(t, tokens(t.instruction)) for t in train]
    eval_tokens = [(e, tokens(e.instruction)) for e in eval_]
    for threshold in (0.5, 0.6):
        brute = sorted((e.line, t.line) for e, et in eval_tokens for t, tt in train_tokens
                       if jaccard(et, tt) >= threshold)
        found = sorted((p.eval_line, p.train_line) for p in find_leakage(train, eval_, near_threshold=threshold))
        assert found == brute
    assert len(find_leakage(train, eval_, near_threshold=0.5)) == 38


def test_leakage_injected_into_real_train_file(apibench, tmp_path):
    """Real eval rows 5 (verbatim) and 100 (upper-cased) appended to the real train file are found."""
    train_lines = examples_path(apibench, "torchhub", "train").read_text(encoding="utf-8").splitlines()
    eval_lines = examples_path(apibench, "torchhub", "eval").read_text(encoding="utf-8").splitlines()
    row100 = json.loads(eval_lines[99])
    instruction = "I want to classify some images using a state-of-the-art model."
    assert instruction in row100["code"]
    row100["code"] = row100["code"].replace(instruction, "i want to CLASSIFY some images  using a State-of-the-Art model.")
    _write(examples_path(tmp_path, "torchhub", "train"),
           [json.loads(x) for x in train_lines] + [json.loads(eval_lines[4]), row100])
    shutil.copy(examples_path(apibench, "torchhub", "eval"), tmp_path / "apibench")
    train, eval_ = load_examples(tmp_path, "torchhub", "train"), load_examples(tmp_path, "torchhub", "eval")
    tp, ep = examples_path(tmp_path, "torchhub", "train"), examples_path(tmp_path, "torchhub", "eval")
    with pytest.raises(RatuneError) as err:
        check_leakage(train, eval_, train_path=tp, eval_path=ep)
    assert f"{tp}:838 <-> {ep}:5 (exact" in str(err.value)
    assert f"{tp}:839 <-> {ep}:100 (normalised" in str(err.value)
    kept, pairs = drop_leaked(train, eval_)
    assert len(kept) == 837 and [(p.train_line, p.eval_line, p.kind) for p in pairs] == [
        (838, 5, "exact"), (839, 100, "normalised")]


# --------------------------------------------------------------------------------------------
# Conflicting domains


def test_conflicting_domains_rule_small():
    db = [{"api_call": "f('a', 'b')", "domain": "Vision"},       # 1
          {"api_call": "g()", "domain": "Text"},                  # 2
          {"api_call": "f('a','b')", "domain": "Audio"},          # 3: same call as 1 (whitespace), other domain
          {"api_call": "f('a', 'b')", "domain": "Vision"},        # 4
          {"api_call": "g()", "domain": "Text "},                 # 5: same domain after strip: no conflict
          {"api_call": "h()", "domain": "Tabular Regression"},    # 6
          {"api_call": "h()", "domain": "Tabular Classification"},  # 7
          {"api_call": "h()", "domain": "Tabular Regression"}]    # 8
    conflicts = conflicting_domains(db)
    assert conflicts == [
        DomainConflict(api_call="f('a', 'b')", identity="f('a','b')", entries=(1, 3, 4), domains=("Vision", "Audio"),
                       domain="Vision", decided_by=1),
        DomainConflict(api_call="h()", identity="h()", entries=(6, 7, 8),
                       domains=("Tabular Regression", "Tabular Classification"), domain="Tabular Regression",
                       decided_by=6)]
    assert all(c.rule == DOMAIN_RULE for c in conflicts) and "first entry in file order" in DOMAIN_RULE
    # the first entry decides even when a later domain is more frequent
    assert conflicting_domains([{"api_call": "x()", "domain": "B"}] + [{"api_call": "x()", "domain": "A"}] * 5,
                               lines=[10, 12, 13, 14, 15, 16])[0].domain == "B"
    assert conflicting_domains([{"api_call": "x()", "domain": "B"}, {"api_call": "x()", "domain": "A"}],
                               lines=[10, 12])[0].entries == (10, 12)
    assert conflicting_domains(db[:2]) == []


def test_conflicting_domains_small_file(tmp_path):
    path = tmp_path / "db.jsonl"
    _write(path, [{"api_call": "m.load('u')", "domain": "Text embedding"}, {"api_call": "m.load( 'u' )",
                                                                             "domain": "Text classification"}])
    (c,) = conflicting_domains(load_api_database(path))
    assert (c.entries, c.domain, c.domains) == ((1, 2), "Text embedding", ("Text embedding", "Text classification"))


@pytest.mark.parametrize("hub,calls,entries", [("torchhub", 0, 0), ("huggingface", 3, 33), ("tensorflowhub", 4, 247)])
def test_real_conflicting_domains_counts(apibench, hub, calls, entries):
    conflicts = conflicting_domains(load_api_database(api_database_path(apibench, hub)))
    assert len(conflicts) == calls
    assert sum(len(c.entries) for c in conflicts) == entries


def test_real_conflicting_domains_examples(apibench):
    """The cases official_semantics.md section 5 names (its entry numbers are 0-based, ours are lines)."""
    hf = {c.api_call: c for c in conflicting_domains(load_api_database(api_database_path(apibench, "huggingface")))}
    joblib = hf["joblib.load('model.joblib')"]
    assert (len(joblib.entries), joblib.decided_by, joblib.domain) == (29, 849, "Tabular Tabular Classification")
    assert set(joblib.domains) == {"Tabular Tabular Classification", "Tabular Tabular Regression"}
    assert hf["AutoModelForCausalLM.from_pretrained('microsoft/DialoGPT-large')"].domain == (
        "Natural Language Processing Text Generation")
    assert hf["AutoModelForCausalLM.from_pretrained('microsoft/DialoGPT-large')"].entries == (578, 601)
    assert hf["Pipeline.from_pretrained('pyannote/speaker-diarization@2.1')"].entries == (750, 847)
    tf = {c.api_call: c for c in conflicting_domains(load_api_database(api_database_path(apibench, "tensorflowhub")))}
    use = tf["hub.load('https://tfhub.dev/google/universal-sentence-encoder/4')"]
    assert (len(use.entries), use.decided_by, use.domain) == (220, 2, "Text embedding")
    assert set(use.domains) == {"Text embedding", "Text preprocessing", "Text classification", "Video classification",
                                "Audio event classification"}
    assert tf["hub.load('https://tfhub.dev/google/tf2-preview/gnews-swivel-20dim/1')"].decided_by == 1


# --------------------------------------------------------------------------------------------
# The report and the one-call entry point


def test_validate_splits_policies(bench):
    root = bench(
        train=[_train_row("Find an API for depth estimation."), _train_row("find an API for DEPTH estimation."),
               _train_row("Translate text to French."), _train_row("Detect faces in photos.")],
        eval_=[_eval_row("Translate text to French."), _eval_row("Count cars on a road.")])
    splits = {"train": load_examples(root, "torchhub", "train"), "eval": load_examples(root, "torchhub", "eval")}
    db = [{"api_call": "f()", "domain": "A"}, {"api_call": "f()", "domain": "B"}]
    tp, ep = examples_path(root, "torchhub", "train"), examples_path(root, "torchhub", "eval")

    with pytest.raises(RatuneError, match=r"_train\.json:3 <-> \S*_eval\.json:1 \(exact"):
        validate_splits(splits, db, train_path=tp, eval_path=ep)  # default policy: error
    with pytest.raises(RatuneError, match="unknown leakage policy 'keep'"):
        validate_splits(splits, db, leakage="keep")

    out, report = validate_splits(splits, db, train_path=tp, eval_path=ep, leakage="drop")
    assert [e.line for e in out["train"]] == [1, 4]  # 2: duplicate of 1; 3: leaked
    assert out["eval"] is splits["eval"] and [e.line for e in splits["train"]] == [1, 2, 3, 4]  # inputs untouched
    assert report.duplicates_removed == 1 and report.duplicate_groups == [[1, 2]]
    assert report.leak_pairs == [LeakPair(3, 1, "exact", 1.0)] and report.leaked_train_rows_dropped == 1
    assert [c.decided_by for c in report.domain_conflicts] == [1]
    m = report.to_manifest()
    assert m["duplicates"] == {"removed": 1, "groups": 1, "group_lines": [[1, 2]]}
    assert m["leakage"]["by_kind"] == {"exact": 1, "normalised": 0, "near": 0}
    assert m["leakage"]["train_rows_dropped"] == 1 and m["leakage"]["policy"] == "drop"
    assert m["leakage"]["pair_list"] == [{"train_line": 3, "eval_line": 1, "kind": "exact", "similarity": 1.0}]
    assert m["domain_conflicts"]["list"] == [{"api_call": "f()", "entries": [1, 2], "domains": ["A", "B"],
                                              "domain": "A", "decided_by": 1}]
    assert json.loads(json.dumps(m, sort_keys=True)) == m
    assert "duplicates removed 1" in report.summary() and "train rows dropped 1" in report.summary()

    out, report = validate_splits(splits, None, leakage="allow", dedupe_train=False)
    assert [e.line for e in out["train"]] == [1, 2, 3, 4] and len(report.leak_pairs) == 1
    assert report.duplicate_groups == [[1, 2]] and report.duplicates_removed == 0 and report.domain_conflicts == []

    out, report = validate_splits({"eval": splits["eval"]}, None)  # no train split: nothing to compare
    assert out == {"eval": splits["eval"]} and report.leakage_policy is None


def test_validate_splits_real_torchhub_is_clean(apibench):
    splits = {s: load_examples(apibench, "torchhub", s) for s in ("train", "eval")}
    db = load_api_database(api_database_path(apibench, "torchhub"))
    out, report = validate_splits(splits, db, train_path=examples_path(apibench, "torchhub", "train"),
                                  eval_path=examples_path(apibench, "torchhub", "eval"))
    assert out == splits
    m = report.to_manifest()
    assert m["duplicates"]["removed"] == 0 and m["leakage"]["pairs"] == 0 and m["domain_conflicts"]["calls"] == 0
    assert m == validate_splits(splits, db)[1].to_manifest()  # deterministic
    assert ValidationReport().to_manifest()["leakage"]["near_threshold"] == NEAR_DUPLICATE_JACCARD


def test_build_dataset_refuses_leakage_and_drops_on_request(tmp_path, smol_tokenizer):
    """The data build runs the checks: leakage stops it by default; --leakage drop removes the
    leaked training row and records it in the manifest; duplicates are removed."""
    import json as _json

    from ratune.data.build import BuildSettings, build_dataset
    from ratune.errors import RatuneError

    folder = tmp_path / "apibench"
    (folder / "api").mkdir(parents=True)
    (folder / "apibench").mkdir()
    doc = {"domain": "D", "api_call": "torch.hub.load(repo_or_dir='a/b', model='m')"}
    (folder / "api" / "torchhub_api.jsonl").write_text(_json.dumps(doc) + "\n")

    def row(instruction):
        return _json.dumps({"code": f"###Instruction: {instruction}\n###Output: {{'domain': 'D'}}",
                            "api_call": doc["api_call"], "provider": "PyTorch", "api_data": doc})

    (folder / "apibench" / "torchhub_train.json").write_text(
        "\n".join([row("Classify birds in photos."), row("classify  BIRDS in photos."),
                   row("Detect cars on the road.")]) + "\n")
    (folder / "apibench" / "torchhub_eval.json").write_text(row("Detect cars on the road.") + "\n")
    settings = BuildSettings(max_length=512)
    with pytest.raises(RatuneError, match=r"torchhub_train.json:3 <-> .*torchhub_eval.json:1 \(exact"):
        build_dataset(apibench_dir=folder, hub="torchhub", out_dir=tmp_path / "a", tokenizer=smol_tokenizer,
                      tokenizer_name="t", modes=["none"], progress=False, settings=settings)
    manifest = build_dataset(apibench_dir=folder, hub="torchhub", out_dir=tmp_path / "b", tokenizer=smol_tokenizer,
                             tokenizer_name="t", modes=["none"], progress=False, settings=settings, leakage="drop")
    assert manifest["rows_read"] == {"train": 3, "eval": 1}
    assert manifest["splits"] == {"train": 1, "eval": 1}  # one duplicate removed, one leaked row dropped
    assert manifest["validation"]["leakage"]["train_rows_dropped"] == 1
