"""AST scoring of APIBench responses: the official Gorilla metric (``gorilla``) and ratune's
``strict`` metric. The metrics and the package's modules: docs/scoring.md. Every public name is
importable from ``ratune.eval.scoring`` itself.
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
