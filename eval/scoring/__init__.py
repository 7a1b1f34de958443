"""AST scoring of APIBench responses: the official Gorilla metric and ratune's strict metric.

Two metrics are computed for every response, both from the same extracted ``api_call`` string
and the same tree-sitter parse (nothing is ever executed or eval'd):

``gorilla``
    The official APIBench AST evaluation (gorilla/eval/eval-scripts/ast_eval_{th,hf,tf}.py at
    commit 6ea5797), reproduced quirk for quirk (docs/scoring.md): eval/scoring/gorilla.py.

``strict``
    Ours: the call is correct only when it names the question's own gold API (the eval line's
    ``api_data.api_call``); hallucination when it names nothing the hub's API database knows;
    error otherwise: eval/scoring/strict.py.

The package, by section:

* ``parse``: the tree-sitter parser stack (pinned versions, :func:`parser_versions`) and node
  readers;
* ``hub_rules``: each hub's rules, one :class:`HubRules` object per hub (:data:`HUB_RULES`): the
  only place the metrics differ between hubs;
* ``gorilla`` and ``strict``: the two metrics;
* ``scorer``: :class:`Scorer`, both metrics for every response of one hub;
* ``responses``: response files (:func:`load_responses`) and which hub they are for;
* ``cli``: ``ratune eval score``.

Every public name is importable from ``ratune.eval.scoring`` itself.
"""

from ratune.eval.scoring.cli import add_score_arguments, format_table, summary
from ratune.eval.scoring.gorilla import GorillaIndex, extract_api_call
from ratune.eval.scoring.hub_rules import (HUB_RULES, HubRules, HuggingFaceRules, TensorFlowHubRules, TorchHubRules,
                                           call_identity, rules_for)
from ratune.eval.scoring.parse import PARSER_DISTRIBUTIONS, PINNED_PARSER, parser_versions
from ratune.eval.scoring.responses import (HUB_CHECK_MIN, HUB_LOADERS, check_hub_matches, check_question_ids,
                                           hub_evidence, load_responses)
from ratune.eval.scoring.scorer import METRICS, OUTCOMES, ResponseScore, Scorer
from ratune.eval.scoring.strict import STRICT_MAX_TRIES, STRICT_WINDOW, StrictIndex, normalize_call

#: HuggingFace keyword arguments that carry a model id (:attr:`HuggingFaceRules.MODEL_KEYWORDS`).
HF_MODEL_KEYWORDS = HuggingFaceRules.MODEL_KEYWORDS
#: TorchHub entry points named by their variant (:attr:`TorchHubRules.VARIANT_ENTRY_POINTS`).
TORCHHUB_VARIANT_ENTRY_POINTS = TorchHubRules.VARIANT_ENTRY_POINTS

__all__ = [
    "GorillaIndex", "HF_MODEL_KEYWORDS", "HUB_CHECK_MIN", "HUB_LOADERS", "HUB_RULES", "HubRules", "HuggingFaceRules",
    "METRICS", "OUTCOMES", "PARSER_DISTRIBUTIONS", "PINNED_PARSER", "ResponseScore", "STRICT_MAX_TRIES",
    "STRICT_WINDOW", "Scorer", "StrictIndex", "TORCHHUB_VARIANT_ENTRY_POINTS", "TensorFlowHubRules", "TorchHubRules",
    "add_score_arguments", "call_identity", "check_hub_matches", "check_question_ids", "extract_api_call",
    "format_table", "hub_evidence", "load_responses", "normalize_call", "parser_versions", "rules_for", "summary",
]
